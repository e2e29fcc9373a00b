"""SD515 c10d-socket-connect."""
from __future__ import annotations

from stalldoc.model import Severity
from stalldoc.rules.log_signature import LogSignature


class C10dSocketConnect(LogSignature):
    """A rank cannot reach torch.distributed's rendezvous store (TCPStore) yet.

    What it does
        Matches c10d's socket warnings: ``[c10d] The client socket has failed to connect to
        [host]:port (errno: N - reason)`` and ``The client socket has timed out after N while
        trying to connect to``.

    Why is this bad?
        The rank retries until the store timeout, then dies with a store timeout (SD514); the
        ranks that did connect wait for it. Repeated lines mean MASTER_ADDR / MASTER_PORT is
        wrong or unreachable (firewall, another interface), or rank 0 is not up (crashed, still
        starting, or bound elsewhere). A few lines at start-up while rank 0 starts are normal.

    Evidence
        the lines; ``peer`` (the store's address), ``errno`` and ``reason``; the global ranks
        that printed them.

    Fix
        Check MASTER_ADDR / MASTER_PORT on every node (same values, an address of rank 0's node
        reachable from the others: ``nc -zv ADDR PORT``), that rank 0 is alive, and that no
        firewall blocks the port; for a vLLM / TRL communicator check the host and port given to
        ``init_communicator`` / ``vllm_server_host``.

    References
        gensyn-ai/rl-swarm#197 (errno 110 - Connection timed out).
    """

    code = "SD515"
    name = "c10d-socket-connect"
    severity = Severity.WARNING
    headline = "cannot reach the c10d store"
    patterns = (
        r"\[c10d\] The client socket has failed to connect to (?P<peer>\S+) \(errno: "
        r"(?P<errno>\d+) - (?P<reason>[^)]*)\)",
        r"The client socket has timed out after (?P<waited>\S+) while trying to connect to "
        r"(?P<peer>.+?)\.?$",
    )
    fix = ("Check MASTER_ADDR/MASTER_PORT on every node (same values, reachable: nc -zv ADDR PORT), "
           "that rank 0 is alive, and that no firewall blocks the port; for a vLLM/TRL communicator "
           "check the host and port it was given.")
