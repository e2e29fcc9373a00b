"""Where a rank's steps go: each kind of phase's share of its last cycles.

A cycle runs from one start of the rank's outermost repeated phase to the next: its rollout
(TRL and swift generate and score once per cycle, inside a training step), else its generation
(a loop of its own calling vLLM's ``generate``), else its training step. The time of each kind
is exclusive (``model.agent.PhaseKinds``): a weight sync inside a rollout inside a step counts
as weight sync only. A step's own time (forward, backward, optimizer) is ``train``; a rollout's
own (log-prob forwards, advantages) is ``rollout``; time in no phase of a kind (data loading,
logging, evaluation, checkpoints) is ``other``. The first cycle is left out: it holds the
start-up (engines loading, graphs compiled, the first weight sync)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from stalldoc.model.agent import CYCLE_KINDS as CYCLE_KINDS
from stalldoc.model.agent import PhaseKinds

# a kind's share under the name the report and the metrics give it
SHARE_NAMES = {"step": "train", "rollout": "rollout", "generate": "generate",
               "reward": "reward", "weight_sync": "weight_sync", "offload": "offload",
               "async_wait": "waiting"}
MIN_CYCLES = 3


@dataclass(frozen=True)
class StepShares:
    """A rank's last ``cycles`` cycles, each a start of ``cycle_kind``: ``seconds`` long in all,
    ``shares`` of that time by name (``SHARE_NAMES`` and ``other``, summing to 1), and how often
    each kind was entered in them."""

    rank: int
    cycle_kind: str
    cycles: int
    started_at: float
    seconds: float
    shares: tuple[tuple[str, float], ...]
    entries: tuple[tuple[str, int], ...]

    def share(self, name: str) -> float:
        return dict(self.shares).get(name, 0.0)

    def entered(self, kind: str) -> int:
        return dict(self.entries).get(kind, 0)

    @property
    def cycle_seconds(self) -> float:
        return self.seconds / self.cycles


def step_shares(rank: int, history: Sequence[PhaseKinds],
                cycles: int | None = MIN_CYCLES) -> StepShares | None:
    """The shares over the rank's last ``cycles`` (or more) complete cycles, or over all of
    them (``None``), the first cycle left out; None while it has run fewer. ``history``: the
    rank's counts as read, oldest first, one of them at least near each cycle's start."""
    if not history:
        return None
    kind = history[-1].cycle_kind
    if kind is None:
        return None
    end = _first_at(history, history[-1].entered(kind), kind)
    if cycles is None:
        start = next((h for h in history if h.entered(kind) >= 2), None)
        cycles = 1
    else:
        start = _window_start(history, end.entered(kind) - cycles, kind)
    if start is None or end.entered(kind) - start.entered(kind) < cycles \
            or end.counted_at <= start.counted_at:
        return None
    return _between(rank, kind, start, end)


def _first_at(history: Sequence[PhaseKinds], count: int, kind: str) -> PhaseKinds:
    """The first read at which ``kind`` had been entered ``count`` times: nearest that start."""
    return next(h for h in history if h.entered(kind) == count)


def _window_start(history: Sequence[PhaseKinds], most: int, kind: str) -> PhaseKinds | None:
    """The read nearest the start of cycle ``most`` (or of the latest one before it), past the
    first cycle; None when there is none."""
    fit = [h for h in history if 2 <= h.entered(kind) <= most]
    if not fit:
        return None
    return _first_at(fit, max(h.entered(kind) for h in fit), kind)


def _between(rank: int, kind: str, start: PhaseKinds, end: PhaseKinds) -> StepShares:
    seconds = end.counted_at - start.counted_at
    spent = {k: max(0.0, end.spent(k) - start.spent(k)) for k, _ in end.seconds}
    shares = [(SHARE_NAMES[k], min(1.0, t / seconds)) for k, t in spent.items()]
    other = max(0.0, 1.0 - sum(share for _, share in shares))
    entries = tuple((k, end.entered(k) - start.entered(k)) for k, _ in end.entries)
    return StepShares(rank, kind, end.entered(kind) - start.entered(kind), start.counted_at,
                      seconds, (*shares, ("other", other)), entries)
