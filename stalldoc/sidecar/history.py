"""The recent samples the rules look back on: per rank host samples and CUDA states, per GPU
samples, and the node's memory, each a bounded deque."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from stalldoc.model.agent import CudaState
from stalldoc.model.samples import GpuSample, HostMemory, HostSample
from stalldoc.model.samples import Tick

HISTORY = 120   # ticks kept


@dataclass
class Histories:
    host: dict[int, deque[HostSample]] = field(default_factory=dict)
    gpus: dict[int, deque[GpuSample]] = field(default_factory=dict)
    node: deque[HostMemory] = field(default_factory=lambda: deque(maxlen=HISTORY))
    cuda: dict[int, deque[tuple[float, CudaState]]] = field(default_factory=dict)

    def add(self, tick: Tick) -> None:
        for row in tick.host.values():
            self.host.setdefault(row.rank, deque(maxlen=HISTORY)).append(row)
        for gpu in tick.gpus:
            self.gpus.setdefault(gpu.index, deque(maxlen=HISTORY)).append(gpu)
        if tick.node is not None:
            self.node.append(tick.node)
        for rank, agent in tick.agents.items():
            if agent.cuda is not None:
                self.cuda.setdefault(rank, deque(maxlen=HISTORY)).append((tick.t, agent.cuda))

    def stopped_pids(self) -> set[int]:
        return {s[-1].pid for s in self.host.values() if s and s[-1].status == "stopped"}

    def frozen(self) -> tuple[dict, dict, tuple, dict]:
        """(host, gpus, node, cuda) as tuples for a Window."""
        return ({r: tuple(s) for r, s in self.host.items()},
                {g: tuple(h) for g, h in self.gpus.items()}, tuple(self.node),
                {r: tuple(h) for r, h in self.cuda.items()})


def gpu_util_by_rank(tick: Tick) -> dict[int, int | None]:
    """The highest utilisation among the GPUs each rank's process tree uses."""
    out: dict[int, int | None] = {}
    for gpu in tick.gpus:
        for rank in gpu.ranks:
            if gpu.util_gpu is not None:
                out[rank] = max(out.get(rank) or 0, gpu.util_gpu)
    return out
