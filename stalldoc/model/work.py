"""The stall decision's records: a rank's evidence of work at a tick, and a stall episode."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class RankWork:
    """One rank's evidence of work at one tick, and the verdict drawn from it.

    ``verdict`` is "work" (the rank is doing something: it is slow, not stuck), "idle" (nothing
    seen, or CPU spent spinning inside a wait) or "pending" (busy on the CPU or GPU, its stack not
    classified yet: never counted as stuck)."""

    t: float
    verdict: str
    reason: str                      # "collectives moved", "reading 4.0 MB/s", "waiting: queue"...
    progressed: bool                 # markers, collectives, CUDA markers or progress lines moved
    cpu_percent: float | None
    children: int
    children_cpu_percent: float | None
    io_bps: float | None             # this tick's (the reason gives the recent average)
    gpu_util: int | None
    stack_kind: str                  # "working", "waiting: <why>", "" (not sampled)
    frame: str = ""                  # the user frame of the last classified stack
    since_progress: float = 0.0      # seconds since markers / collectives / lines last moved
    busy_unchanged: float = 0.0      # seconds busy in one working stack with nothing else moving
    cpu_wait_percent: float | None = None   # runnable, waiting for a CPU (% of one core)

    @property
    def working(self) -> bool:
        return self.verdict == "work"

    def describe(self) -> str:
        """'cpu 98%, io 4.0 MB/s, 2 children at 190%, gpu 0%, stack working' for evidence; a rank
        that waited for a CPU says so: 'cpu 4% (waiting for a CPU 61%)'."""
        return describe_together([self])


def describe_together(seen: Sequence[RankWork]) -> str:
    """What ranks doing the same showed, as ``RankWork.describe`` says it of one: a figure that
    differs between them is the most any showed ('cpu up to 2%, io 0 kB/s, stack not sampled').
    Their stack kind (the first's) is what they do; group them by it first."""
    cpu = f"cpu {_most([w.cpu_percent for w in seen], _pct)}"
    waits = [w.cpu_wait_percent or 0.0 for w in seen]
    if max(waits) >= 1.0:
        cpu += f" (waiting for a CPU {_most(waits, _pct)})"
    parts = [cpu, f"io {_most([w.io_bps for w in seen], _rate)}"]
    if any(w.children for w in seen):
        parts.append(f"{_most([w.children for w in seen], str)} children at "
                     f"{_most([w.children_cpu_percent for w in seen], _pct)}")
    if any(w.gpu_util is not None for w in seen):
        parts.append(f"gpu {_most([w.gpu_util for w in seen], lambda v: f'{v}%')}")
    parts.append(f"stack {seen[0].stack_kind or 'not sampled'}")
    return ", ".join(parts)


def _most(values: Sequence[float | int | None], say: Callable[[Any], str]) -> str:
    """One figure said: the same for all, else 'up to' the most (unknown where none is known)."""
    known = [v for v in values if v is not None]
    if not known:
        return say(None)
    said = {say(v) for v in known}
    top = say(max(known))
    return top if len(said) == 1 and len(known) == len(values) else f"up to {top}"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def _rate(bps: float | None) -> str:
    if bps is None:
        return "?"
    return f"{bps / 1e6:.1f} MB/s" if bps >= 1e5 else f"{bps / 1e3:.0f} kB/s"


@dataclass(frozen=True)
class StallEpisode:
    """No rank made progress from ``started_at``; seen as a stall at ``detected_at``."""

    id: int
    started_at: float
    detected_at: float
    threshold: float
    ranks: tuple[int, ...]
    ended_at: float | None = None
    phases: Mapping[int, str] = field(default_factory=dict)   # rank -> phase stack when detected
    work: Mapping[int, RankWork] = field(default_factory=dict)  # rank -> what was seen at detection
    outside: bool = False   # the job's own stall: every rank waited for its next task, and its
                            # driver and actors showed no work either (sidecar/ray_job.py)
