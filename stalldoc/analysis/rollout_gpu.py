"""How busy a rank's GPUs are while it generates: its ticks inside a rollout or a generation
(the innermost phase of a kind, as the agent counts them), each weighted by the time since the
tick before, with NVML's utilisation of the GPUs its processes (the rank, its engine's
workers) hold. Pure functions: the sidecar's history keeps the samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from stalldoc.agent.statefile import PHASE_KINDS, phase_kind
from stalldoc.model.samples import GenerationSample, GpuSample

GENERATION_KINDS = frozenset({"rollout", "generate"})
MIN_SAMPLES = 10      # ticks generating, with a GPU read, before a figure is given


@dataclass(frozen=True)
class GenerationGpu:
    """A rank's GPUs over its recent ticks generating: ``seconds`` of them, and the GPUs'
    mean utilisation then (0 to 1, weighted by time)."""

    rank: int
    samples: int
    seconds: float
    gpus: tuple[int, ...]
    busy: float


def generating(phase_stack: Sequence[str]) -> bool:
    """The innermost phase of a kind is a rollout or a generation (a phase of none, vLLM's
    ``forward``, counts as the kind it runs inside)."""
    for name in reversed(phase_stack):
        kind = phase_kind(name)
        if kind >= 0:
            return PHASE_KINDS[kind] in GENERATION_KINDS
    return False


def generation_sample(rank: int, t: float, seconds: float, phase_stack: Sequence[str],
                      gpus: Iterable[GpuSample]) -> GenerationSample | None:
    """The tick's sample of ``rank``, None unless it generates on GPUs whose utilisation NVML
    gave."""
    if seconds <= 0 or not generating(phase_stack):
        return None
    busy = tuple((g.index, g.util_gpu) for g in gpus
                 if rank in g.ranks and g.util_gpu is not None)
    return GenerationSample(t, seconds, busy) if busy else None


def generation_gpu(rank: int, samples: Sequence[GenerationSample],
                   least: int = MIN_SAMPLES) -> GenerationGpu | None:
    """The rank's GPUs over ``samples``; None with fewer than ``least`` of them."""
    if len(samples) < least:
        return None
    seconds = sum(s.seconds for s in samples)
    busy = sum(s.seconds * sum(u for _, u in s.gpus) / len(s.gpus) for s in samples)
    gpus = tuple(sorted({i for s in samples for i, _ in s.gpus}))
    return GenerationGpu(rank, len(samples), seconds, gpus, busy / seconds / 100.0)
