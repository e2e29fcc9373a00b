"""Host probe (psutil): per rank CPU time and %, RSS, threads and state, the share of time its
threads were runnable but waiting for a CPU (a starved rank works, slowly), and the work of its
own process tree (its descendants' CPU and CPU wait, the bytes the rank and its descendants read
and write, to files and pipes and over TCP: ``tcp_bytes``); for the node, available memory,
swap traffic and load against cores."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

import psutil

from stalldoc.model.ranks import RankProcess
from stalldoc.model.samples import HostMemory, HostSample
from stalldoc.probes.proc_table import (ProcessGone, ProcessTable, ProcInfo, read_cpu_wait,
                                        read_io, scan)
from stalldoc.probes.tcp_bytes import TcpBytes


@dataclass(frozen=True)
class _Usage:
    """A process's cumulative CPU seconds, I/O bytes (rchar + wchar, and its TCP connections'
    bytes) and seconds runnable but waiting for a CPU at one moment."""

    t: float
    cpu: float
    io: int | None
    start: int          # when the process started (clock ticks after boot): with the pid,
                        # which process this is
    wait: float | None = None


@dataclass(frozen=True)
class _Rates:
    """A process's CPU %, I/O bytes/s and CPU wait % since its previous reading (None: no
    previous reading, or nothing to compare)."""

    cpu: float | None = None
    io: float | None = None
    wait: float | None = None


def _reading(now: float, info: ProcInfo, threads: bool, tcp: TcpBytes) -> _Usage | None:
    """The process's usage now (its I/O, files' and TCP sockets' bytes, and CPU wait read at
    once: of every thread with ``threads``, else of its main thread); None when it ended since
    the scan."""
    try:
        io = read_io(info.pid)
        if io is not None:
            io += tcp.of(info.pid, info.start_ticks)
        return _Usage(now, info.cpu_seconds, io, info.start_ticks,
                      read_cpu_wait(info.pid, threads))
    except ProcessGone:
        return None


def children_of(parents: Mapping[int, int]) -> dict[int, list[int]]:
    """ppid -> its children, from ``parents`` (pid -> ppid)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    return children


def rank_of(pid: int, rank_pids: Mapping[int, int], parents: Mapping[int, int]) -> int | None:
    """The rank whose process tree holds ``pid`` (the rank itself or any descendant)."""
    seen = 0
    while pid and seen < 64:
        if pid in rank_pids:
            return rank_pids[pid]
        pid = parents.get(pid, 0)
        seen += 1
    return None


def descendants(root: int, children: Mapping[int, list[int]], stop: set[int]) -> list[int]:
    """Pids below ``root`` in the process tree ``children`` (ppid -> pids), not entering
    ``stop`` (other ranks: their work is their own)."""
    out: dict[int, None] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in stop or pid in out:
            continue
        out[pid] = None
        todo.extend(children.get(pid, ()))
    return list(out)


class HostProbe:
    name = "host"

    def __init__(self) -> None:
        self._usage: dict[int, _Usage] = {}                 # pid -> last reading
        self._swap: tuple[float, int, int] | None = None    # (t, sin, sout)
        self._last_tick: float | None = None                # when sample() last ran
        self._last_uptime: int | None = None                # and its table was read (ticks)
        self._tcp = TcpBytes(os.getpid())                   # TCP bytes moved, per process

    def sample(self, now: float, ranks: list[RankProcess],
               parents: Mapping[int, int] | None = None,
               table: ProcessTable | None = None,
               apart: Iterable[int] = ()) -> list[HostSample]:
        """One sample per live rank; a rank that is gone is skipped. ``table`` is this tick's
        snapshot of the process table (taken now when not given). ``apart``: processes below a
        rank whose CPU and I/O are not its work (a serving engine's, judged by its forward
        passes: its workers spin in their waits): their CPU is the sample's
        ``engine_cpu_percent``. A process one of them started and that is none of them (the C++
        compiler torch.compile runs at a vLLM TP worker's first steps) works as any
        child of the rank does: it is the rank's work."""
        table = scan(now=now) if table is None else table
        available = psutil.virtual_memory().available
        self._tcp.refresh()
        rank_pids, apart = {r.pid for r in ranks}, set(apart)
        children = children_of(parents or {})
        out, seen = [], set()
        for rank in ranks:
            below = descendants(rank.pid, children, rank_pids)
            tree = [pid for pid in below if pid not in apart]
            engines = [pid for pid in below if pid in apart]
            seen.update(below, (rank.pid,))
            sample = self._rank_sample(now, rank, tree, available, table, engines)
            if sample is not None:
                out.append(sample)
        self._forget(set(self._usage) - seen)
        self._tcp.forget(seen)
        self._last_tick, self._last_uptime = now, table.uptime
        return out

    def _rank_sample(self, now: float, rank: RankProcess, tree: list[int], available: int,
                     table: ProcessTable, engines: list[int]) -> HostSample | None:
        info = table.get(rank.pid)
        if info is None or info.dead:   # gone, or a zombie: its memory reads 0, not a sample
            return None
        own = _reading(now, info, True, self._tcp)
        if own is None:
            return None
        rates = self._rates(rank.pid, own)
        child, live = self._tree_rates(now, tree, table)
        engine, running = self._tree_rates(now, engines, table)
        io = None if rates.io is None else rates.io + (child.io or 0.0)
        self._usage[rank.pid] = own
        return HostSample(now, rank.rank, rank.pid, own.cpu, info.rss_bytes, info.threads,
                          info.status, available, rates.cpu, live,
                          child.cpu if live or child.cpu else None,
                          None if io is None else round(io, 1), rates.wait,
                          child.wait if live else None,
                          engine.cpu if running else None)

    def _tree_rates(self, now: float, tree: Iterable[int],
                    table: ProcessTable) -> tuple[_Rates, int]:
        """CPU %, I/O bytes/s and CPU wait % (of their main threads) of a rank's descendants
        since the last tick; how many live.

        A descendant first seen now counts in full if it was born since the last tick (a
        short-lived worker), else it only sets its baseline."""
        cpu = io = wait = 0.0
        live = 0
        for pid in tree:
            info = table.get(pid)
            if info is not None and info.dead:
                continue
            usage = None if info is None else _reading(now, info, False, self._tcp)
            if usage is None:
                self._forget([pid])
                continue
            live += 1
            rates = self._rates(pid, usage, self._born_since_last(info))
            cpu += rates.cpu or 0.0
            io += rates.io or 0.0
            wait += rates.wait or 0.0
            self._usage[pid] = usage
        return _Rates(round(cpu, 1), io, round(wait, 1)), live

    def _born_since_last(self, info: ProcInfo) -> bool:
        """Started after the last tick's table was read: none of its work was seen yet."""
        return self._last_uptime is not None and info.start_ticks >= self._last_uptime

    def _rates(self, pid: int, usage: _Usage,
               born: bool = False) -> _Rates:
        """CPU %, I/O bytes/s and CPU wait % since the last reading of ``pid``; none before one
        exists (a pid now held by a new process has none). With ``born`` (a process started
        since the last tick) it counts from zero."""
        last = self._usage.get(pid)
        if last is not None and last.start != usage.start:
            last = None   # the pid was reused
        if last is None and born and self._last_tick is not None and usage.t > self._last_tick:
            last = _Usage(self._last_tick, 0.0, 0, usage.start, 0.0)   # all of it is new
        if last is None or usage.t <= last.t:
            return _Rates()
        dt = usage.t - last.t
        io = (None if usage.io is None or last.io is None
              else max(0.0, (usage.io - last.io) / dt))
        wait = (None if usage.wait is None or last.wait is None
                else round(max(0.0, 100.0 * (usage.wait - last.wait) / dt), 1))
        return _Rates(round(100.0 * (usage.cpu - last.cpu) / dt, 1), io, wait)

    def _forget(self, pids: Iterable[int]) -> None:
        for pid in list(pids):
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
