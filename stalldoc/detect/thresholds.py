"""Adaptive stall thresholds: a phase seen to take long, or seen to sit without any work for a
while and then go on, gets a threshold above its longest run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from stalldoc.model.agent import PhaseRecord

SAFETY_FACTOR = 2.0


@dataclass
class PhaseDurations:
    """The longest completed duration of each phase name, over all ranks, and the longest quiet
    spell each phase went through before work resumed ('' for ranks outside any phase)."""

    longest: dict[str, float] = field(default_factory=dict)
    quiet: dict[str, float] = field(default_factory=dict)
    _counted: dict[int, int] = field(default_factory=dict)

    def update(self, rank: int, completed: int, phases: Sequence[PhaseRecord]) -> None:
        """Fold in a rank's phase ring; ``completed`` is how many phases it finished in all."""
        new = completed - self._counted.get(rank, 0)
        self._counted[rank] = completed
        for record in phases[len(phases) - min(new, len(phases)):]:
            if record.duration > self.longest.get(record.name, 0.0):
                self.longest[record.name] = record.duration

    def resumed(self, phase_stacks: Iterable[str], seconds: float) -> None:
        """A stall ended on its own after ``seconds`` with ranks in these phase stacks: a quiet
        spell that long is normal there."""
        for stack in set(phase_stacks):
            phase = stack.rsplit("/", 1)[-1]
            self.quiet[phase] = max(self.quiet.get(phase, 0.0), seconds)

    def threshold(self, phase: str, floor: float) -> float:
        """``floor``, or SAFETY_FACTOR × the longest run or quiet spell of ``phase``."""
        seen = max(self.longest.get(phase, 0.0) if phase else 0.0, self.quiet.get(phase, 0.0))
        return max(floor, SAFETY_FACTOR * seen)
