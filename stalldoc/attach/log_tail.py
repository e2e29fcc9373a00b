"""``stalldoc attach --log FILE``: the job's log as the watcher's job output.

At attach, the last ``TAIL_BYTES`` of the file are read (its lines carry the file's modification
time: when they were written is not known better); with ``--follow`` a thread reads what is
appended from then on, and starts over when the file is truncated or replaced (rotated).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from stalldoc.attach.target import NotAttachable
from stalldoc.model.samples import LogLine

TAIL_BYTES = 256 * 1024
POLL_SECONDS = 0.5
READ_BYTES = 1 << 20
STREAM = "log"


class LogTail:
    """One log file, read from its tail on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fh = open(path, "rb")   # noqa: SIM115 - kept open while following
            st = os.fstat(self.fh.fileno())
        except OSError as exc:
            raise NotAttachable(f"cannot read --log {path}: {exc.strerror or exc}") from exc
        self.inode, self.mtime = st.st_ino, st.st_mtime
        self.partial = b""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tail(self) -> list[LogLine]:
        """The lines of the file's last ``TAIL_BYTES`` (a cut first line left out)."""
        size = os.fstat(self.fh.fileno()).st_size
        start = max(0, size - TAIL_BYTES)
        self.fh.seek(start)
        data = self.fh.read(size - start)
        if start > 0:
            data = data.partition(b"\n")[2]
        lines = self._lines(data, self.mtime)
        if self.partial:   # a last line without its end: taken as it is
            lines.append(self._line(self.partial, self.mtime))
            self.partial = b""
        return lines

    def follow(self, put: Callable[[LogLine], None]) -> None:
        """Hand every line appended from now on to ``put``, from a thread, until ``close``."""
        self._thread = threading.Thread(target=self._run, args=(put,), name="stalldoc-log",
                                        daemon=True)
        self._thread.start()

    def _run(self, put: Callable[[LogLine], None]) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._reopen_if_replaced()
                data = self.fh.read(READ_BYTES)
            except OSError:
                continue
            for line in self._lines(data, time.time()):
                put(line)

    def _reopen_if_replaced(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return
        if st.st_ino != self.inode:
            self.fh.close()
            self.fh = open(self.path, "rb")   # noqa: SIM115
            self.inode, self.partial = st.st_ino, b""
        elif st.st_size < self.fh.tell():
            self.fh.seek(0)                   # truncated
            self.partial = b""

    def _lines(self, data: bytes, t: float) -> list[LogLine]:
        data, self.partial = self.partial + data, b""
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return [self._line(line, t) for line in lines]

    @staticmethod
    def _line(data: bytes, t: float) -> LogLine:
        return LogLine(t, STREAM, data.decode("utf-8", "replace").rstrip("\r"))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.fh.close()
