"""SD516 nccl-network-error."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class NcclNetworkError(LogSignature):
    """NCCL's network transport (InfiniBand / RoCE verbs or TCP sockets) reports a failure.

    What it does
        Matches NCCL's transport warnings: ``NET/IB : Got completion from peer X with error N``
        (or ``status=N``) ``... vendor err V``, ``NET/IB : Got async event``, ``Call to ibv_...
        failed``, ``socketProgress: Connection closed by remote peer X``, ``Net : Call to recv
        from X failed``, ``socketStartConnect: Connect to X failed``, ``Socket recv failed while
        polling`` and ``[Proxy Service N] Failed to execute operation``. Only ``NCCL WARN`` lines
        (and the same text quoted in an exception's "Last error"): the INFO lines NCCL prints at
        start-up and teardown (``Using network IB``, ``Connection closed by localRank``) are not
        findings.

    Why is this bad?
        The collective that needed this connection can never complete: the ranks hang until the
        watchdog timeout (SD501) or abort with ncclRemoteError / ncclSystemError (SD517). IB
        completion status 12 (retry exceeded) is a link or route that dropped packets for longer
        than NCCL_IB_TIMEOUT allows; status 5 (flushed) follows another failure; "closed by remote
        peer" usually means the peer process died first - its own log has the first error.

    Evidence
        the lines; ``peer``, ``status`` and ``vendor_err`` of an IB completion; the global ranks
        that printed them (NCCL's own ``host:pid:tid [N]`` prefix names the local GPU, not a rank).

    Fix
        Find the peer's first error (it often died first). InfiniBand: check the links (``ibstat``,
        ``ibv_devinfo``), set NCCL_IB_HCA to the right HCAs, raise NCCL_IB_TIMEOUT (e.g. 22) /
        NCCL_IB_RETRY_CNT. Sockets: NCCL_SOCKET_IFNAME must name an interface every node reaches
        (not docker0 / lo).

        InfiniBand: also the switch counters; ``NCCL_IB_HCA=mlx5_0,mlx5_1,...``; NCCL_IB_GID_INDEX
        for RoCE. Run with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET`` and test the fabric with
        nccl-tests (``all_reduce_perf``).

    References
        NVIDIA/nccl#1405 and NVIDIA/nccl#1814 (status=12 / 5, vendor err 129 / 249),
        NVIDIA/nccl#928 (error 4, vendor err 81), NVIDIA/nccl#1612, NVIDIA/nccl-tests#166
        (socketProgress: Connection closed by remote peer), NVIDIA/nccl#795 (Call to recv
        failed : Broken pipe; a remote rank crashed), NVIDIA/nccl#2076 (nodes with IB issues),
        NVIDIA/nccl-tests#252, deepseek-ai/DeepEP#106.
    """

    code = "SD516"
    name = "nccl-network-error"
    severity = Severity.ERROR
    headline = "NCCL network error"
    patterns = (
        r"NET/IB ?: Got completion from peer (?P<peer>\S+) with (?:error |status=)(?P<status>\d+),? "
        r"opcode[= ]?\d+,? len[= ]?\d+,? vendor err (?P<vendor_err>\d+)",
        r"NCCL WARN NET/IB ?: Got async event ?: (?P<event>.+)",
        r"Call to (?P<verb>ibv_\w+) failed",
        r"socketProgress(?:Opt)?: Connection closed by remote peer (?P<peer>\S+)",
        r"socketProgress(?:Opt)?: Call to (?:recv|send) from (?P<peer>\S+) failed ?: (?P<reason>.+)",
        r"NCCL WARN Net ?: (?:Call to (?:recv|send) from|Connection closed by remote peer) "
        r"(?P<peer>\S+)",
        r"NCCL WARN socketStartConnect: Connect to (?P<peer>\S+) failed",
        r"NCCL WARN Socket recv failed while polling",
        r"NCCL WARN \[Proxy Service \d+\] Failed to execute operation (?P<operation>\w+)",
        r"NCCL WARN \[Service thread\] Connection closed by localRank",
    )
