"""Host probe (psutil): per rank CPU time and %, RSS, threads and state; for the node, available
memory, swap traffic and load against cores."""
from __future__ import annotations

import os

import psutil

from stalldoc.model import HostMemory, HostSample, RankProcess


class HostProbe:
    name = "host"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._cpu: dict[int, tuple[float, float]] = {}     # pid -> (t, cpu seconds)
        self._swap: tuple[float, int, int] | None = None    # (t, sin, sout)

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
        return proc

    def sample(self, now: float, ranks: list[RankProcess]) -> list[HostSample]:
        """One sample per live rank; a rank that is gone is skipped."""
        available = psutil.virtual_memory().available
        out = []
        for rank in ranks:
            try:
                proc = self._process(rank.pid)
                with proc.oneshot():
                    status = proc.status()
                    if status == psutil.STATUS_ZOMBIE:  # dead: its memory reads 0, not a sample
                        continue
                    times = proc.cpu_times()
                    cpu = times.user + times.system
                    out.append(HostSample(now, rank.rank, rank.pid, cpu, proc.memory_info().rss,
                                          proc.num_threads(), status, available,
                                          self._cpu_percent(rank.pid, now, cpu)))
            except psutil.Error:
                self._procs.pop(rank.pid, None)
                self._cpu.pop(rank.pid, None)
        return out

    def _cpu_percent(self, pid: int, now: float, cpu: float) -> float | None:
        last = self._cpu.get(pid)
        self._cpu[pid] = (now, cpu)
        if last is None or now <= last[0]:
            return None
        return round(100.0 * (cpu - last[1]) / (now - last[0]), 1)

    def node(self, now: float) -> HostMemory:
        """Available memory, swap in/out rate since the last call, 1-minute load, cores."""
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        rates: tuple[float | None, float | None] = (None, None)
        if self._swap is not None and now > self._swap[0]:
            dt = now - self._swap[0]
            rates = ((swap.sin - self._swap[1]) / dt, (swap.sout - self._swap[2]) / dt)
        self._swap = (now, swap.sin, swap.sout)
        return HostMemory(now, memory.available, memory.total, *rates, os.getloadavg()[0],
                          psutil.cpu_count() or 1)
