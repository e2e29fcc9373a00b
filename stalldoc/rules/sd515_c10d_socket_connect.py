"""SD515 c10d-socket-connect."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class C10dSocketConnect(LogSignature):
    """A rank cannot reach torch.distributed's rendezvous store (TCPStore) yet.

    What it does
        Matches c10d's warning for each failed attempt: ``[c10d] The client socket has failed to
        connect to [host]:port (errno: N - reason)``. The final errors after the retries (``timed
        out after 60s while trying to connect``, ``failed to connect to any network address``)
        are SD514's. ``The client socket cannot be initialized to connect to ... (errno: 97 -
        Address family not supported by protocol)`` is not a finding: torch tries IPv6 first and
        goes on with IPv4.

    Why is this bad?
        The rank retries until the store timeout, then dies with a store timeout (SD514); the
        ranks that did connect wait for it. Repeated lines mean MASTER_ADDR / MASTER_PORT is
        wrong or unreachable (firewall, another interface), or rank 0 is not up (crashed, still
        starting, or bound elsewhere). A few lines at start-up while rank 0 starts are normal.

    Evidence
        the lines; ``peer`` (the store's address), ``errno`` and ``reason``; the global ranks
        that printed them.

    Fix
        Check MASTER_ADDR / MASTER_PORT on every node (the same values, an address of rank 0's node
        reachable from the others: ``nc -zv ADDR PORT``), that rank 0 is alive, and that no firewall
        blocks the port; for a vLLM / TRL communicator check the host and port given to
        ``init_communicator`` / ``vllm_server_host``.

    References
        gensyn-ai/rl-swarm#197 (errno 110 - Connection timed out), hpcaitech/Open-Sora#667,
        ofsoundof/GRL-Image-Restoration#27 (behind a launcher's ``trainer/0 [1]:`` prefix),
        sgl-project/sglang#2561 (the harmless errno 97 attempts).
    """

    code = "SD515"
    name = "c10d-socket-connect"
    severity = Severity.WARNING
    headline = "cannot reach the c10d store"
    patterns = (
        r"\[c10d\] The client socket has failed to connect to (?P<peer>\S+) \((?:errno|system "
        r"error): (?P<errno>\d+) - (?P<reason>[^)]*)\)",
    )
