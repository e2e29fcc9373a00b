"""The relay's last resort after an error of its own: copy the job's output and wait for the job,
nothing else, so the job still gets its output relayed and the shell its exit code."""
from __future__ import annotations

import os
import select
import time

from stalldoc.run.terminal import write_all
from stalldoc.probes.exits import from_wait_status

READ_BYTES = 1 << 18


def read_chunk(fd: int) -> bytes:
    """Up to 256 kB from ``fd``; b"" at its end (EIO: every end of a pseudo-terminal closed)."""
    try:
        return os.read(fd, READ_BYTES)
    except OSError:
        return b""


def copy_until_exit(streams: dict[int, int], job_pid: int, code: int | None, exited_at: float,
                    drain_wait: float) -> int:
    """``streams``: read end → where it goes. Returns the job's exit status (shell convention)."""
    while code is None or streams:
        if code is not None and time.time() - exited_at > drain_wait:
            break
        ready = select.select(list(streams), [], [], 0.25)[0] if streams else []
        for fd in ready:
            data = read_chunk(fd)
            if data:
                write_all(streams[fd], data)
            else:
                del streams[fd]
        if code is None:
            status = _reap(job_pid)
            if status is not None:
                code, exited_at = from_wait_status(status)[0], time.time()
    return code if code is not None else 0


def _reap(job_pid: int) -> int | None:
    """Reap every ended child; the job's wait status if it was one of them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == job_pid:
            found = status
