"""How ranks ended. A thread waits on a pidfd per rank, so a death is seen at once, and reads the
exit status from /proc while the dead rank is still a zombie (before its launcher reaps it).
Launcher reports in the job's output (torchrun's ``exitcode : -9 (pid: 1234)``) fill in the
status where that race was lost."""
from __future__ import annotations

import os
import re
import select
import threading
import time

from stalldoc.model.ranks import RankExit, RankProcess

_TORCHRUN_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)")


def zombie_status(pid: int) -> int | None:
    """The raw wait status of a zombie (field 52 of /proc/PID/stat), None if not readable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 50 or fields[0] != "Z":
        return None
    return int(fields[49])


def from_wait_status(status: int) -> tuple[int, int | None]:
    """(exit status in shell convention, signal or None) from a raw wait status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    return os.WEXITSTATUS(status), None


def parse_launcher_line(line: str) -> tuple[int, int] | None:
    """(pid, returncode as Popen gives it: -N for signal N) from a launcher's failure report."""
    match = _TORCHRUN_EXIT.search(line) or _TORCHRUN_FAILED.search(line)
    if not match:
        return None
    return int(match.group(2)), int(match.group(1))


class DeathWatch:
    """Watches rank pids; ``drain()`` returns the exits seen since the last call."""

    def __init__(self) -> None:
        self._fds: dict[int, tuple[int, RankProcess]] = {}
        self._exits: list[RankExit] = []
        self._lock = threading.Lock()
        self._poll = select.poll()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stalldoc-exits", daemon=True)
        self._thread.start()

    def watch(self, rank: RankProcess) -> None:
        if any(r.pid == rank.pid for _, r in self._fds.values()):
            return
        try:
            fd = os.pidfd_open(rank.pid)
        except OSError:
            return
        with self._lock:
            self._fds[fd] = (fd, rank)
            self._poll.register(fd, select.POLLIN)

    def unwatch(self, pid: int) -> None:
        """Stop watching a pid (a process first taken for a rank, then replaced)."""
        with self._lock:
            for fd, (_, rank) in list(self._fds.items()):
                if rank.pid == pid:
                    self._poll.unregister(fd)
                    os.close(fd)
                    del self._fds[fd]

    def _run(self) -> None:
        while not self._stop.is_set():
            for fd, _ in self._poll.poll(200):
                self._dead(fd)

    def _dead(self, fd: int) -> None:
        with self._lock:
            if fd not in self._fds:
                return
            _, rank = self._fds.pop(fd)
            self._poll.unregister(fd)
        status = zombie_status(rank.pid)
        os.close(fd)
        code, sig = from_wait_status(status) if status is not None else (None, None)
        with self._lock:
            self._exits.append(RankExit(rank.rank, rank.pid, time.time(), code, sig,
                                        "proc" if status is not None else "unknown"))

    def drain(self) -> list[RankExit]:
        with self._lock:
            out, self._exits = self._exits, []
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
