"""SD517 nccl-error."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class NcclError(LogSignature):
    """A torch.distributed collective failed with an NCCL error code.

    What it does
        Matches torch's NCCL exceptions: ``NCCL error in: FILE:LINE, <reason>, NCCL version V``,
        ``Collective WorkNCCL(SeqNum=N, OpType=X, ...) raised the following async exception: NCCL
        error: <reason>``, the error code line (``ncclUnhandledCudaError: Call to CUDA function
        failed.``, ``ncclSystemError``, ``ncclInternalError``, ``ncclRemoteError``,
        ``ncclInvalidUsage``, ``ncclInvalidArgument``) and ``NCCL communicator was aborted on
        rank N``.

    Why is this bad?
        The rank's communicator is broken: it raises (or the watchdog aborts it, SD513) and its
        peers hang in their next collective until their timeout.
        ncclRemoteError: a peer died or the network failed (look for SD516 and the peer's log).
        ncclSystemError: a system call failed (socket, shared memory: /dev/shm too small in a
        container, a wrong interface). ncclUnhandledCudaError: a CUDA call inside NCCL failed
        (an earlier CUDA error on that GPU, broken peer-to-peer, driver / CUDA mismatch).
        ncclInternalError: with NCCL 2.18 network errors were reported as internal errors
        (NVIDIA/nccl#1092). ncclInvalidUsage / ncclInvalidArgument: ranks called mismatched
        collectives, a rank reused a communicator after an error, or the NCCL library and
        torch's build disagree.

    Evidence
        the lines; ``reason`` / ``nccl_error``, ``where``, ``nccl_version``, ``seq`` and ``op``
        of an async failure; the global ranks that printed them.

    Fix
        Rerun with NCCL_DEBUG=WARN (or INFO) to get NCCL's "Last error", then by kind: remote error:
        the rank or node that failed first, and the fabric (SD516); system error: shared memory and
        sockets; unhandled CUDA error: the first CUDA error or Xid on that GPU; invalid usage: make
        ranks issue the same collectives.

        System error: give the container ``--shm-size`` / ``--ipc=host``, set ``NCCL_SOCKET_IFNAME``
        (and ``NCCL_IB_DISABLE=1`` without a working InfiniBand). Unhandled CUDA error: on GPUs
        without working P2P (consumer cards, VMs with IOMMU) set ``NCCL_P2P_DISABLE=1``; NCCL 2.18.6
        fixed one such bug (NVIDIA/nccl#1024). Internal error on NCCL 2.18: often a network error
        (NCCL_DEBUG=WARN, NCCL_SOCKET_IFNAME).

    References
        NVIDIA/nccl#1410 (ncclUnhandledCudaError, Cuda failure 1 'invalid argument'),
        NVIDIA/nccl#2076 (remote process exited or there was a network
        error: nodes with IB issues), NVIDIA/nccl#934 (the same error), pytorch/pytorch#149984 (async ncclSystemError),
        NVIDIA/nccl#1024, pytorch/pytorch#17349 (an unhandled cuda error; a commenter's
        unhandled system error fixed with NCCL_SOCKET_IFNAME), vllm-project/vllm#10453, NVIDIA/nccl#1247 and NVIDIA/nccl#520
        (ncclInternalError in vLLM workers and under DeepSpeed's launcher), NVIDIA/nccl#1092
        (NCCL 2.18 reported network errors as internal), SpursGoZmy/Table-LLaVA#4
        (ncclInvalidArgument).
    """

    code = "SD517"
    name = "nccl-error"
    severity = Severity.ERROR
    headline = "NCCL error"
    patterns = (
        r"Collective WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+).*?raised the following async "
        r"exception: NCCL error: (?P<reason>[^,(]+?)\s*(?:[,(]|$)",
        r"NCCL error in: (?P<where>[^,]+), (?P<reason>[^,(]+?)\s*(?:[,(]|$)"
        r"(?:.*?NCCL version (?P<nccl_version>\d[\w.+]*))?",
        r"\b(?P<nccl_error>nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|"
        r"InvalidUsage|RemoteError)): (?P<message>.+)",
        r"NCCL communicator was aborted on rank (?P<aborted_rank>\d+)",
        r"NCCL error: (?P<reason>[^,(]+?)\s*(?:[,(]|$)",
    )
    # a communicator aborted for a watchdog timeout: that timeout is the cause (SD501 says it)
    yields = (r"Original reason for failure was: .*Watchdog caught collective operation timeout",)
