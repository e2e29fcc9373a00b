"""Host probe (psutil): per rank CPU time and %, RSS, threads and state, and the work of its own
process tree (its descendants' CPU, the bytes the rank and its descendants read and write); for
the node, available memory, swap traffic and load against cores."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

import psutil

from stalldoc.model import HostMemory, HostSample, RankProcess


@dataclass(frozen=True)
class _Usage:
    """A process's cumulative CPU seconds and I/O bytes (rchar + wchar) at one moment."""

    t: float
    cpu: float
    io: int | None


def descendants(root: int, parents: Mapping[int, int], stop: set[int]) -> list[int]:
    """Pids below ``root`` in the process table ``parents`` (pid -> ppid), not entering ``stop``
    (other ranks: their work is their own)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in stop or pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


class HostProbe:
    name = "host"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._usage: dict[int, _Usage] = {}                 # pid -> last reading
        self._swap: tuple[float, int, int] | None = None    # (t, sin, sout)
        self._last_tick: float | None = None                # when sample() last ran

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
        return proc

    def sample(self, now: float, ranks: list[RankProcess],
               parents: Mapping[int, int] | None = None) -> list[HostSample]:
        """One sample per live rank; a rank that is gone is skipped."""
        available = psutil.virtual_memory().available
        rank_pids = {r.pid for r in ranks}
        out, seen = [], set()
        for rank in ranks:
            tree = descendants(rank.pid, parents or {}, rank_pids)
            seen.update(tree, (rank.pid,))
            try:
                sample = self._rank_sample(now, rank, tree, available)
            except psutil.Error:
                sample = None
            if sample is not None:
                out.append(sample)
        self._forget(set(self._usage) - seen)
        self._last_tick = now
        return out

    def _rank_sample(self, now: float, rank: RankProcess, tree: list[int],
                     available: int) -> HostSample | None:
        proc = self._process(rank.pid)
        with proc.oneshot():
            status = proc.status()
            if status == psutil.STATUS_ZOMBIE:  # dead: its memory reads 0, not a sample
                return None
            own = self._read(proc, now)
            rss, threads = proc.memory_info().rss, proc.num_threads()
        cpu_pct, own_io = self._rates(rank.pid, own)
        child_cpu, child_io, live = self._tree_rates(now, tree)
        io = None if own_io is None else own_io + child_io
        self._usage[rank.pid] = own
        return HostSample(now, rank.rank, rank.pid, own.cpu, rss, threads, status, available,
                          cpu_pct, live, child_cpu if live or child_cpu else None,
                          None if io is None else round(io, 1))

    def _tree_rates(self, now: float, tree: Iterable[int]) -> tuple[float, float, int]:
        """CPU % and I/O bytes/s of a rank's descendants since the last tick; how many live.

        A descendant first seen now counts in full if it was born since the last tick (a
        short-lived worker), else it only sets its baseline."""
        cpu = io = 0.0
        live = 0
        for pid in tree:
            try:
                proc = self._process(pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    usage, born = self._read(proc, now), proc.create_time()
            except psutil.Error:
                self._forget([pid])
                continue
            live += 1
            pct, rate = self._rates(pid, usage, born)
            cpu += pct or 0.0
            io += rate or 0.0
            self._usage[pid] = usage
        return round(cpu, 1), io, live

    @staticmethod
    def _read(proc: psutil.Process, now: float) -> _Usage:
        times = proc.cpu_times()
        try:
            counters = proc.io_counters()
            io: int | None = counters.read_chars + counters.write_chars
        except (psutil.AccessDenied, AttributeError, NotImplementedError):
            io = None
        return _Usage(now, times.user + times.system, io)

    def _rates(self, pid: int, usage: _Usage,
               born: float | None = None) -> tuple[float | None, float | None]:
        """(CPU %, I/O bytes/s) since the last reading of ``pid``; None before one exists."""
        last = self._usage.get(pid)
        if last is None and born is not None and self._last_tick is not None \
                and born >= self._last_tick and usage.t > self._last_tick:
            last = _Usage(self._last_tick, 0.0, 0)   # born since the last tick: all of it is new
        if last is None or usage.t <= last.t:
            return None, None
        dt = usage.t - last.t
        io = (None if usage.io is None or last.io is None
              else max(0.0, (usage.io - last.io) / dt))
        return round(100.0 * (usage.cpu - last.cpu) / dt, 1), io

    def _forget(self, pids: Iterable[int]) -> None:
        for pid in list(pids):
            self._procs.pop(pid, None)
            self._usage.pop(pid, None)

    def node(self, now: float) -> HostMemory:
        """Available memory, swap in/out rate since the last call, 1-minute load, cores."""
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        rates: tuple[float | None, float | None] = (None, None)
        if self._swap is not None and now > self._swap[0]:
            dt = now - self._swap[0]
            rates = ((swap.sin - self._swap[1]) / dt, (swap.sout - self._swap[2]) / dt)
        self._swap = (now, swap.sin, swap.sout)
        return HostMemory(now, memory.available, memory.total, *rates, os.getloadavg()[0],
                          psutil.cpu_count() or 1, _procs_running())


def _procs_running() -> int | None:
    """Runnable threads right now (less this one), from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("procs_running"):
                    return max(0, int(line.split()[1]) - 1)
    except (OSError, ValueError, IndexError):
        pass
    return None
