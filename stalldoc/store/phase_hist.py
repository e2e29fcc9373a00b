"""Phase durations summed as they arrive: an exact count and maximum per phase name, and a
histogram of 1 %-wide logarithmic bins holding each bin's count and total, so medians and p95s
stay within 1 % of the exact figure (exact when a bin holds one value) whatever the run's length.
"""
from __future__ import annotations

import math
from typing import Iterable

RATIO = 1.01
ZERO_BIN = -(10 ** 6)      # durations of zero (or clock steps backwards)


def duration_bin(seconds: float) -> int:
    if seconds <= 0 or not math.isfinite(seconds):
        return ZERO_BIN
    return math.floor(math.log(seconds) / math.log(RATIO))


def _value_at(bins: list[tuple[int, int, float]], k: int) -> float:
    """The k-th smallest duration (0-based), as the mean of its bin."""
    seen = 0
    for _, count, total in bins:
        seen += count
        if k < seen:
            return total / count
    return bins[-1][2] / bins[-1][1]


def summary(count: int, maximum: float, bins: Iterable[tuple[int, int, float]]) -> dict[str, float]:
    """count / median / p95 / max of one phase from its (bin, count, total) rows."""
    ordered = sorted(bins)
    median = (_value_at(ordered, (count - 1) // 2) + _value_at(ordered, count // 2)) / 2
    p95 = _value_at(ordered, min(count - 1, int(round(0.95 * (count - 1)))))
    return {"count": count, "median": round(median, 4), "p95": round(p95, 4),
            "max": round(maximum, 4)}
