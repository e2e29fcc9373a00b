"""The watcher's link for ``stalldoc attach``: no relay, no job started by stalldoc.

``watch.Watcher`` talks to the relay through its link (``sidecar.RelayLink``). attach has none:
this stands in for it. What the watcher says is printed (it is the diagnosis); its other
messages (a rank's pid for the relay, the status line) have nobody to go to, and a request to
end the job is never honoured: attach only observes. The job's end is seen by the watcher
itself, as when the relay is gone: its tree is empty (``relay_gone``).
"""
from __future__ import annotations

import threading
from typing import Callable, TextIO

from stalldoc.model.samples import LogLine


class AttachLink:
    """What ``Watcher`` reads and calls on its link, for a job it did not start."""

    def __init__(self, out: TextIO, job_pid: int, started_at: float) -> None:
        self.out = out
        self.on_line: Callable[[LogLine], None] | None = None
        self.job_started = threading.Event()
        self.job_started.set()
        self.job_pid = job_pid
        self.job_started_at = started_at
        self.job_code: int | None = None      # never known: the job is not our child
        self.job_ended = threading.Event()    # never set: nobody says the job ended
        self.watch_code: int | None = None
        self.ended_by = "job"
        self.dropped = 0
        self.ending = False                   # attach never ends the job
        self.interrupted_at: float | None = None   # nor forwards an interrupt to it
        self.relay_gone = True                # the job's end: its tree is empty
        self.reaped: dict[int, int] = {}
        self._lock = threading.Lock()

    def send(self, **message: object) -> None:
        """Print what the watcher says (already redacted by it); drop the rest."""
        if "say" not in message:
            return
        with self._lock:
            self.out.write(f"{message['say']}\n")
            self.out.flush()

    def line(self, line: LogLine) -> None:
        """A line of the job's log (``--log``), for the watcher."""
        if self.on_line is not None:
            self.on_line(line)
