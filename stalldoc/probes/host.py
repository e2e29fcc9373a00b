"""Host probe (psutil): CPU time, RSS, threads and state of each rank; host available memory."""
from __future__ import annotations

import psutil

from stalldoc.model import HostSample, RankProcess


class HostProbe:
    name = "host"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
        return proc

    def sample(self, now: float, ranks: list[RankProcess]) -> list[HostSample]:
        available = psutil.virtual_memory().available
        out = []
        for rank in ranks:
            try:
                proc = self._process(rank.pid)
                with proc.oneshot():
                    cpu = proc.cpu_times()
                    out.append(HostSample(now, rank.rank, rank.pid, cpu.user + cpu.system,
                                          proc.memory_info().rss, proc.num_threads(),
                                          proc.status(), available))
            except psutil.Error:
                self._procs.pop(rank.pid, None)
        return out
