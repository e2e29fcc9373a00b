"""The recent samples the rules look back on: per rank host samples and CUDA states, per GPU
samples, and the node's memory, each a bounded deque."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from stalldoc.analysis.phase_shares import StepShares, step_shares
from stalldoc.analysis.rollout_gpu import generation_sample
from stalldoc.model.agent import CudaState, PhaseKinds
from stalldoc.model.samples import GenerationSample, GpuSample, HostMemory, HostSample
from stalldoc.model.samples import Tick

HISTORY = 120   # ticks kept
KIND_READS = 64   # reads of a rank's time by kind of phase kept: one per change of its cycles


@dataclass
class Histories:
    host: dict[int, deque[HostSample]] = field(default_factory=dict)
    gpus: dict[int, deque[GpuSample]] = field(default_factory=dict)
    node: deque[HostMemory] = field(default_factory=lambda: deque(maxlen=HISTORY))
    cuda: dict[int, deque[tuple[float, CudaState]]] = field(default_factory=dict)
    kinds: dict[int, deque[PhaseKinds]] = field(default_factory=dict)
    generation: dict[int, deque[GenerationSample]] = field(default_factory=dict)
    last_t: float | None = None

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
            if agent.kinds is not None:
                self._add_kinds(rank, agent.kinds)
        self._add_generation(tick)
        self.last_t = tick.t

    def _add_generation(self, tick: Tick) -> None:
        """Each rank generating on GPUs: the tick's share of time and its GPUs' utilisation."""
        seconds = 0.0 if self.last_t is None else tick.t - self.last_t
        for rank, agent in tick.agents.items():
            sample = generation_sample(rank, tick.t, seconds, agent.phase_stack, tick.gpus)
            if sample is not None:
                self.generation.setdefault(rank, deque(maxlen=HISTORY)).append(sample)

    def _add_kinds(self, rank: int, kinds: PhaseKinds) -> None:
        """Kept when it starts a cycle (``analysis/phase_shares.py`` measures between them)."""
        kept = self.kinds.setdefault(rank, deque(maxlen=KIND_READS))
        if kinds.restarted(kept[-1] if kept else None):
            kept.clear()
        if kinds.starts_cycle(kept[-1] if kept else None):
            kept.append(kinds)

    def generation_samples(self) -> dict[int, tuple[GenerationSample, ...]]:
        return {rank: tuple(samples) for rank, samples in self.generation.items()}

    def kind_reads(self) -> dict[int, tuple[PhaseKinds, ...]]:
        return {rank: tuple(reads) for rank, reads in self.kinds.items()}

    def step_shares(self) -> dict[int, StepShares]:
        """Each rank's shares of its last cycles, where it has run enough of them."""
        out = {}
        for rank, reads in self.kinds.items():
            shares = step_shares(rank, tuple(reads))
            if shares is not None:
                out[rank] = shares
        return out

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
