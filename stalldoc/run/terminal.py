"""The terminal: the job's output, stalldoc's messages, and a one-line live status at the bottom.

When stderr is a terminal, the watcher keeps one status line there, redrawn in place every tick
(``\\r`` + erase-line). Everything else that reaches the terminal goes through here first, so
the status line is erased before a job's output or a message is written and never ends up in the
middle of them. A job drawing its own progress bar (output not ending in a newline) keeps its
line: the status waits until the job has been quiet for ``QUIET_SECONDS``, which is exactly when a
hang leaves a frozen progress bar behind. Not a terminal: no status, output passes straight on.
"""
from __future__ import annotations

import os
import select
import shutil
import threading
import time
from dataclasses import dataclass
from typing import TextIO

QUIET_SECONDS = 3.0
_ERASE = "\r\x1b[K"


@dataclass(frozen=True)
class RankLine:
    """What the status line says about one rank."""

    rank: int
    idle_seconds: float
    phase: str
    dead: bool = False


def format_status(elapsed: float, ranks: list[RankLine], threshold: float,
                  stall_id: int | None) -> str:
    """``[stalldoc] 0:03:12 4 ranks ok | r0 rollout 0s r1 rollout 0s ...`` in one line."""
    minutes, seconds = divmod(int(elapsed), 60)
    head = f"[stalldoc] {minutes // 60}:{minutes % 60:02d}:{seconds:02d} {len(ranks)} ranks "
    head += f"STALL #{stall_id}" if stall_id is not None else "ok"
    parts = [f"r{r.rank} dead" if r.dead else
             f"r{r.rank}{' ' + r.phase if r.phase else ''} {r.idle_seconds:.0f}s" for r in ranks]
    return f"{head} (threshold {threshold:.0f}s) | " + "  ".join(parts)


class Terminal:
    """Serialises writes to the terminal and owns the status line."""

    def __init__(self, stderr: TextIO, status: bool | None = None) -> None:
        self.stderr = stderr
        self.status_enabled = _isatty(stderr) if status is None else status
        self._lock = threading.Lock()
        self._shown = False
        self._line_open = False
        self._last_output = 0.0

    def job_output(self, fd: int, data: bytes) -> None:
        """Pass a chunk of the job's output on to ``fd``, after erasing the status line."""
        with self._lock:
            self._erase()
            write_all(fd, data)
            self._line_open = not data.endswith(b"\n")
            self._last_output = time.monotonic()

    def message(self, text: str) -> None:
        """A message from stalldoc, prefixed ``[stalldoc]``."""
        with self._lock:
            self._erase()
            if self._line_open:
                self._write("\n")
                self._line_open = False
            self._write(f"[stalldoc] {text}\n")

    def status(self, text: str) -> None:
        """Draw the status line in place (a terminal only)."""
        if not self.status_enabled:
            return
        with self._lock:
            if self._line_open:
                if time.monotonic() - self._last_output < QUIET_SECONDS:
                    return  # the job is drawing its own line
                self._write("\n")
                self._line_open = False
            width = shutil.get_terminal_size((120, 24)).columns - 1
            self._write(_ERASE + text[:width])
            self._shown = True

    def close(self) -> None:
        """Leave the terminal clean: no status line behind."""
        with self._lock:
            self._erase()

    def _erase(self) -> None:
        if self._shown:
            self._write(_ERASE)
            self._shown = False

    def _write(self, text: str) -> None:
        try:
            self.stderr.write(text)
            self.stderr.flush()
        except (OSError, ValueError):
            pass


def write_all(fd: int, data: bytes) -> None:
    """Every byte to ``fd``, waiting while it is full; a closed one is given up on (our own
    output went away: the relay keeps draining, so the job never blocks on it)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except OSError:
            return


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False
