"""One snapshot of the process table per tick: every process's parent, state, CPU seconds, start
time, threads and resident memory, from one pass over ``/proc/PID/stat``.

The job tree, the rank finder and the host probe all read this snapshot instead of asking psutil
process by process (which scanned the whole table once per known process: ``children()`` builds
a pid -> ppid map of every process each time). Only the job's own processes cost more: their
I/O counters (``read_io``) each tick, their environment and command line once (see
``process_tree.RankFinder``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import psutil

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_STAT_READ = 4096      # a stat line is about 300 bytes; its name at most 64
# /proc/PID/stat fields after the name, counted from the state (field 3 in ``man proc``)
_STATE, _PPID, _UTIME, _STIME, _THREADS, _START, _RSS = 0, 1, 11, 12, 17, 19, 21
_EXEC_FIELDS = slice(45, 49)   # arg_start, arg_end, env_start, env_end (Linux 3.5+)
_STATUSES = {"R": psutil.STATUS_RUNNING, "S": psutil.STATUS_SLEEPING,
             "D": psutil.STATUS_DISK_SLEEP, "T": psutil.STATUS_STOPPED,
             "t": psutil.STATUS_TRACING_STOP, "Z": psutil.STATUS_ZOMBIE, "X": psutil.STATUS_DEAD,
             "x": psutil.STATUS_DEAD, "K": "wake-kill", "W": psutil.STATUS_WAKING,
             "I": psutil.STATUS_IDLE, "P": psutil.STATUS_PARKED}


class ProcessGone(Exception):
    """The process ended since the snapshot was taken."""


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One process as ``/proc/PID/stat`` showed it."""

    pid: int
    ppid: int
    name: str                  # the kernel's name for it (comm, at most 15 characters)
    state: str                 # one letter: R S D Z T t X I ...
    cpu_seconds: float         # user + system
    start_ticks: int           # clock ticks after boot: with the pid, the process's identity
    started_at: float          # seconds since the epoch, as psutil's create_time() (which is
                               # up to 1 s early: the boot time it adds is whole seconds)
    threads: int
    rss_bytes: int
    exec_key: tuple[int, ...]  # where its argv and environment lie: an exec moves them

    @property
    def status(self) -> str:
        """psutil's name for the state: 'running', 'sleeping', 'zombie'..."""
        return _STATUSES.get(self.state, "?")

    @property
    def dead(self) -> bool:
        """A zombie (exited, not reaped) or on its way out."""
        return self.state in ("Z", "X", "x")

    @property
    def released(self) -> bool:
        """Its memory is gone while it is not a zombie yet: a process in its exit (or a kernel
        thread). The kernel shows it with no resident pages and no argv or stack addresses; its
        command line reads empty."""
        return self.rss_bytes == 0 and not any(self.exec_key)

    @property
    def identity(self) -> tuple[int, int, tuple[int, ...]]:
        """The same process with the same program: a reused pid or an exec is a new one."""
        return self.pid, self.start_ticks, self.exec_key


@dataclass(frozen=True)
class ProcessTable:
    """Every process at one moment: ``t`` (seconds since the epoch), ``uptime`` (clock ticks
    after boot, as a process's start, taken before the first process was read; a process started
    in that same tick may be in the table or not); ``skipped`` stat lines could not be parsed."""

    t: float
    procs: Mapping[int, ProcInfo]
    children: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    skipped: int = 0
    uptime: int = 0

    def __contains__(self, pid: object) -> bool:
        return pid in self.procs

    def get(self, pid: int) -> ProcInfo | None:
        return self.procs.get(pid)

    def ppid(self, pid: int) -> int:
        """The parent of ``pid``; 0 when the process is not in the table."""
        info = self.procs.get(pid)
        return info.ppid if info is not None else 0

    def subtree(self, pid: int) -> Iterator[int]:
        """Every process below ``pid``, parents before their children."""
        todo = list(reversed(self.children.get(pid, ())))
        while todo:
            child = todo.pop()
            yield child
            todo.extend(reversed(self.children.get(child, ())))


def scan(proc: str = "/proc", now: float | None = None) -> ProcessTable:
    """Read every process's stat file once."""
    uptime = int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLOCK_TICKS)   # processes' clock
    boot = _boot_time(proc)
    procs: dict[int, ProcInfo] = {}
    skipped = 0
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            info = _parse_stat(int(name), _read(f"{proc}/{name}/stat", _STAT_READ), boot)
        except (OSError, ProcessGone):
            continue          # ended while we looked
        except (ValueError, IndexError):
            skipped += 1      # a line this parser does not understand
            continue
        procs[info.pid] = info
    children: dict[int, list[int]] = {}
    for pid in sorted(procs):
        children.setdefault(procs[pid].ppid, []).append(pid)
    return ProcessTable(time.time() if now is None else now, procs,
                        {pid: tuple(kids) for pid, kids in children.items()}, skipped, uptime)


def _parse_stat(pid: int, data: bytes, boot: float) -> ProcInfo:
    if not data:
        raise ProcessGone(pid)
    close = data.rindex(b")")
    name = data[data.index(b"(") + 1 : close].decode("utf-8", "replace")
    rest = data[close + 2 :].split()
    start = int(rest[_START])
    return ProcInfo(pid, int(rest[_PPID]), name, rest[_STATE].decode("ascii", "replace"),
                    int(rest[_UTIME]) / _CLOCK_TICKS + int(rest[_STIME]) / _CLOCK_TICKS, start,
                    boot + start / _CLOCK_TICKS, int(rest[_THREADS]),
                    int(rest[_RSS]) * _PAGE_SIZE, tuple(int(v) for v in rest[_EXEC_FIELDS]))


def read_io(pid: int, proc: str = "/proc") -> int | None:
    """Bytes read and written so far (rchar + wchar, as psutil's read_chars + write_chars); None
    where the kernel refuses (another user's process). Raises ProcessGone if it ended."""
    try:
        data = _read(f"{proc}/{pid}/io", 1024)
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(pid) from exc
    except OSError:
        return None
    total, found = 0, 0
    for line in data.splitlines():
        key, _, value = line.partition(b":")
        if key in (b"rchar", b"wchar"):
            total, found = total + int(value), found + 1
    return total if found == 2 else None


def read_cpu_wait(pid: int, threads: bool = True, proc: str = "/proc") -> float | None:
    """Seconds the process has spent runnable but waiting for a CPU: the scheduler's run-queue
    delay (the second field of ``schedstat``), summed over its live threads, or of its main
    thread alone without ``threads`` (one read instead of one per thread). None where the kernel
    keeps no such count (no CONFIG_SCHED_INFO) or refuses. A thread that ends takes its share
    with it: callers treat a drop as no wait. Raises ProcessGone if the process ended."""
    if not threads:
        try:
            return int(_read(f"{proc}/{pid}/schedstat", 128).split()[1]) / 1e9
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except (OSError, ValueError, IndexError):
            return None
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(pid) from exc
    except OSError:
        return None
    total, found = 0, False
    for tid in tids:
        try:
            total, found = total + int(_read(f"{proc}/{pid}/task/{tid}/schedstat", 128)
                                       .split()[1]), True
        except (OSError, ValueError, IndexError):
            continue          # the thread ended since the listing, or an unreadable line
    return total / 1e9 if found else None


def read_environment(pid: int, wanted: tuple[bytes, ...],
                     proc: str = "/proc") -> dict[bytes, bytes] | None:
    """The ``wanted`` variables of a process's environment (no other value is kept); None
    where it cannot be read (gone, another user's)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {key: value for key, sep, value in pairs if sep and key in wanted}


def _read(path: str, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _boot_time(proc: str) -> float:
    """When the system booted, in seconds since the epoch (``btime``, as psutil reads it)."""
    with open(f"{proc}/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise RuntimeError(f"no btime in {proc}/stat")
