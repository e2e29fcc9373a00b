"""The stall decision's records: a rank's evidence of work at a tick, and a stall episode."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


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
        cpu = f"cpu {_pct(self.cpu_percent)}"
        if (self.cpu_wait_percent or 0.0) >= 1.0:
            cpu += f" (waiting for a CPU {_pct(self.cpu_wait_percent)})"
        parts = [cpu, f"io {_rate(self.io_bps)}"]
        if self.children:
            parts.append(f"{self.children} children at {_pct(self.children_cpu_percent)}")
        if self.gpu_util is not None:
            parts.append(f"gpu {self.gpu_util}%")
        parts.append(f"stack {self.stack_kind or 'not sampled'}")
        return ", ".join(parts)


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
