"""This watch's card for the watches beside it (``cluster/peer_card.py``): rewritten every
``EVERY`` seconds while the job runs, and once more when it ended. A rollout server's watch so
tells a trainer's watch what the server's side saw: the ports its job listens on, the exception
it printed last, its open error findings, its exit."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterable

import psutil

from stalldoc.cluster.peer_card import is_loopback, write_card
from stalldoc.detect.raised_lines import RaisedLines
from stalldoc.findings.ledger import Entry
from stalldoc.model.findings import Severity
from stalldoc.probes.connections import (LISTEN, listening_sockets, socket_inodes,
                                         sockets_by_pid)

EVERY = 5.0
SERIOUS = (Severity.ERROR, Severity.CRITICAL)
MAX_FINDINGS = 8


class PeerCard:
    def __init__(self, run_dir: Path, argv: Iterable[str]) -> None:
        self.run_dir = run_dir
        self.program = program_of(list(argv))
        self.host = socket.gethostname()
        self.addresses = _addresses()
        self.written_at = float("-inf")
        self.errors = 0
        self.ports: list[int] = []
        self.ports_of: tuple[frozenset[int], frozenset[int]] | None = None

    def due(self, now: float) -> bool:
        return now - self.written_at >= EVERY

    def write(self, now: float, job_pids: Iterable[int], entries: Iterable[Entry],
              raised: RaisedLines, stalled: bool, ended: bool = False,
              exit_code: int | None = None) -> None:
        """The card as things stand (a failed write is counted, never raised)."""
        self.written_at = now
        serious = [e.finding for e in entries if e.finding.severity in SERIOUS]
        card = {"host": self.host, "addresses": self.addresses, "program": self.program,
                "state": "ended" if ended else "running",
                "listening": self._listening(job_pids),
                "findings": [{"code": f.code, "severity": f.severity.value,
                              "summary": f.summary[:500]} for f in serious[-MAX_FINDINGS:]],
                "raised": raised.text, "stalled": stalled, "exit_code": exit_code,
                "raised_ago": round(now - raised.t, 1) if raised.t is not None else None}
        try:
            write_card(self.run_dir, card)
        except OSError:
            self.errors += 1


    def _listening(self, job_pids: Iterable[int]) -> list[int]:
        """The ports the job listens on. Which process holds a socket is read from every
        process's descriptors (a third of the watcher's own CPU beside a busy vLLM engine,
        every 5 s: benchmarks/vllm_overhead.py), so it is read again only when the job's
        processes or the host's listening sockets changed since the last card."""
        pids = frozenset(job_pids)
        listening = listening_sockets()
        if listening is None:   # no /proc: psutil's connections, each time
            return _listening(pids)
        key = (pids, frozenset(listening))
        if key != self.ports_of:
            held = set().union(*(socket_inodes(pid) for pid in pids))
            self.ports = sorted({listening[i] for i in held if i in listening})[:64]
            self.ports_of = key
        return self.ports


def program_of(argv: list[str]) -> str:
    """The watched program's name: the command's, or a Python script's or module's."""
    if not argv:
        return ""
    name = os.path.basename(argv[0])
    if not name.startswith("python"):
        return name
    rest = argv[1:]
    if "-m" in rest and rest.index("-m") + 1 < len(rest):
        return rest[rest.index("-m") + 1]
    script = next((a for a in rest if not a.startswith("-")), "")
    return os.path.basename(script) or name


def _listening(pids: Iterable[int]) -> list[int]:
    ports = {s.local[1] for sockets in sockets_by_pid(pids).values() for s in sockets
             if s.state == LISTEN}
    return sorted(ports)[:64]


def _addresses() -> list[str]:
    try:
        found = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values()
                 for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}
    except (OSError, psutil.Error):
        return []
    return sorted(a for a in found if not is_loopback(a))[:32]   # this host's only
