"""SD518 c10d-port-in-use."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class C10dPortInUse(LogSignature):
    """The rendezvous store (TCPStore server on rank 0) cannot listen: its port is taken.

    What it does
        Matches ``[c10d] The server socket has failed to listen on any local network address``,
        ``The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in
        use)`` and libuv's ``name: EADDRINUSE``.

    Why is this bad?
        Rank 0 (or torchrun's agent) dies at start-up while the other ranks, on other nodes or
        already started, wait for a store that never comes (SD514, SD515). The port is held by
        another run on the same node (two jobs both on the default 29500), a zombie process of
        an earlier run, or a service already on that port.

    Evidence
        the lines; ``address``, ``errno`` and ``reason`` of a failed bind; the global ranks that
        printed them.

    Fix
        Give each run its own port (``MASTER_PORT`` / ``--master_port``, which swift and torchrun
        read; on one node ``torchrun --standalone`` or ``--rdzv-endpoint=localhost:0``); find the
        holder with ``ss -ltnp 'sport = :29500'`` (the port in the line) and end the leftover run.

    References
        pytorch/pytorch#85604 and pytorch/pytorch#126510 (errno 98 with torchrun),
        meta-pytorch/torchtune#392 (two runs on the default 29500).
    """

    code = "SD518"
    name = "c10d-port-in-use"
    severity = Severity.ERROR
    headline = "c10d store port in use"
    patterns = (
        r"The server socket has failed to (?:bind to|listen on) (?P<address>[^\s(]+) \(errno: "
        r"(?P<errno>\d+) - (?P<reason>[^)]*)\)",
        r"The server socket has failed to listen on any local network address",
        r"name: EADDRINUSE",
    )
