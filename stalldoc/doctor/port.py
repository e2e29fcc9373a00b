"""The metrics port ``watch --metrics-port`` would serve on: free to bind?"""
from __future__ import annotations

import errno
import socket

from stalldoc.doctor.model import OK, PROBLEM, SKIPPED, Check


def check_port(port: int | None, address: str) -> Check:
    if port is None:
        return Check("metrics-port", SKIPPED, "no --metrics-port given (watch serves no metrics "
                     "unless asked)")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            bound = sock.getsockname()[1]
    except OSError as exc:
        busy = exc.errno == errno.EADDRINUSE
        return Check("metrics-port", PROBLEM,
                     f"{address}:{port} " + ("is in use" if busy else f"cannot be bound: "
                                              f"{exc.strerror or exc}") + ": watch would exit 125",
                     "pick another --metrics-port (0: any free one)",
                     {"address": address, "port": port})
    shown = f"{address}:{port}" if port else f"{address}:0 (any free port, e.g. {bound})"
    return Check("metrics-port", OK, f"{shown} is free", facts={"address": address, "port": port})
