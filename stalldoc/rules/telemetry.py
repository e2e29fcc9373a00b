"""Helpers for the rules that read telemetry over time: the recent part of a history, means that
skip unknown values, and the GPUs a rank runs on."""
from __future__ import annotations

from typing import Iterable, Sequence, TypeVar

from stalldoc.model.samples import GpuSample
from stalldoc.model.window import Window

T = TypeVar("T")
RECENT_SECONDS = 30.0     # how far back the tick rules look
MIN_SAMPLES = 5           # a condition must hold over at least this many samples


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
