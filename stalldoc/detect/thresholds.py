"""Adaptive stall thresholds: a phase seen to take long gets a threshold above its longest run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from stalldoc.agent.statefile import PhaseRecord

SAFETY_FACTOR = 2.0


@dataclass
class PhaseDurations:
    """The longest completed duration of each phase name, over all ranks."""

    longest: dict[str, float] = field(default_factory=dict)
    _counted: dict[int, int] = field(default_factory=dict)

    def update(self, rank: int, completed: int, phases: Sequence[PhaseRecord]) -> None:
        """Fold in a rank's phase ring; ``completed`` is how many phases it finished in all."""
        new = completed - self._counted.get(rank, 0)
        self._counted[rank] = completed
        for record in phases[len(phases) - min(new, len(phases)):]:
            if record.duration > self.longest.get(record.name, 0.0):
                self.longest[record.name] = record.duration

    def threshold(self, phase: str, floor: float) -> float:
        """``floor``, or SAFETY_FACTOR × the longest run of ``phase`` when that is longer."""
        return max(floor, SAFETY_FACTOR * self.longest.get(phase, 0.0))
