"""Ask the ranks' agents for PyTorch Flight Recorder dumps on a stall, and read them back.

The request is a file the agents' heartbeat threads stat (``agent/flight.py``); each answers by
replacing ``<run dir>/flight/rank_<rank>``. A dump is fresh when that file changed (inode or
mtime) since the request. The watcher waits at most ``FLIGHT_WAIT_SECONDS`` from the request and
goes on with what arrived. torch is never imported here (``analysis/flight_recorder.py``).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping

from stalldoc.agent.flight import READY_FILE, REQUEST_FILE
from stalldoc.analysis.flight_recorder import read_dump
from stalldoc.private_files import write_private_file
from stalldoc.model.collectives import FlightDump

FLIGHT_WAIT_SECONDS = 2.0   # from the request; the agents beat every 0.25 s
POLL_SECONDS = 0.05


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class FlightDumps:
    """One request at a time: ``request`` before the stacks are taken, ``collect`` after."""

    def __init__(self, agent_dir: Path, flight_dir: Path, wait: float = FLIGHT_WAIT_SECONDS
                 ) -> None:
        self.agent_dir = agent_dir
        self.flight_dir = flight_dir
        self.wait = wait
        self.before: dict[int, tuple[int, int] | None] = {}
        self.asked_at = 0.0
        self.skipped: dict[str, str] = {}

    def path(self, rank: int) -> Path:
        return self.flight_dir / f"rank_{rank}"

    def request(self, ranks: Mapping[int, int]) -> None:
        """Ask every agent for a dump; remember the dumps that the ranks (rank -> pid) whose
        agent can answer had before: only those are waited for."""
        self.before = {rank: _stamp(self.path(rank)) for rank, pid in ranks.items()
                       if os.path.exists(self.agent_dir / READY_FILE.format(pid=pid))}
        if not self.before:
            return
        self.asked_at = time.monotonic()
        write_private_file(self.agent_dir, REQUEST_FILE, f"{time.time_ns()}\n".encode())

    def fresh(self) -> set[int]:
        return {r for r, old in self.before.items()
                if (new := _stamp(self.path(r))) is not None and new != old}

    def collect(self) -> dict[int, FlightDump]:
        """The fresh dumps of the ranks asked, once all came or the wait is over; why any
        could not be read is in ``skipped``."""
        deadline = self.asked_at + self.wait
        while len(self.fresh()) < len(self.before) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        dumps: dict[int, FlightDump] = {}
        self.skipped = {}
        for rank in sorted(self.fresh()):
            try:
                dumps[rank] = read_dump(self.path(rank))
            except (OSError, ValueError) as exc:
                self.skipped[f"rank_{rank}"] = str(exc)[:200]
        return dumps
