"""Helpers for the rules that read telemetry over time: the recent part of a history, means that
skip unknown values, and the GPUs a rank runs on."""
from __future__ import annotations

from typing import Any, Iterable, Sequence, TypeVar

from stalldoc.analysis.phase_shares import StepShares
from stalldoc.model.samples import GpuSample
from stalldoc.model.window import Window

T = TypeVar("T")
RECENT_SECONDS = 30.0     # how far back the tick rules look
MIN_SAMPLES = 5           # a condition must hold over at least this many samples
MOST = 0.5                # of a rank's cycle: "most of a step" (SD207, SD208)
# a finding about a rank's last cycles (SD207, SD208) is kept this long after it last held: a
# cycle under its threshold, then one over it, is one finding, not two (seen at 57 % and 61 % of
# a step, a slower weight sync between them under load)
SETTLE_SECONDS = 120.0


def recent(samples: Sequence[T], now: float, seconds: float = RECENT_SECONDS) -> list[T]:
    """Samples (anything with ``.t``) from the last ``seconds``."""
    return [s for s in samples if now - s.t <= seconds]  # type: ignore[attr-defined]


def mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def gpus_of(window: Window, rank: int) -> dict[int, list[GpuSample]]:
    """GPU index -> its recent samples, for the GPUs whose processes belong to ``rank``."""
    out = {}
    for index, history in window.gpus.items():
        samples = recent(history, window.now)
        if samples and rank in samples[-1].ranks:
            out[index] = samples
    return out


def gib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


def seconds_text(value: float) -> str:
    """'55 s', '6.2 s', '0.57 s': two figures or more."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s" if value >= 1 else f"{value:.2f} s"


def cycle_evidence(shares: StepShares) -> dict[str, Any]:
    """A rank's last cycles as a finding's evidence: what starts them, how many, how long each,
    and every kind's share."""
    return {"cycle": shares.cycle_kind, "cycles": shares.cycles,
            "cycle_seconds": round(shares.cycle_seconds, 3),
            "shares": {name: round(share, 3) for name, share in shares.shares}}
