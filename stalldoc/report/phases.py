"""Phase durations over a run: count, median, p95 and maximum per phase name."""
from __future__ import annotations

import sqlite3
import statistics

from stalldoc.report import telemetry
from stalldoc.store import phase_hist


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def phase_summary(conn: sqlite3.Connection) -> dict[str, dict[str, float]]:
    """Per phase name: count, median, p95 and max duration in seconds over all ranks (schema
    4 on: from the histogram summed as phases ended; before: from every stored phase)."""
    if telemetry.version(conn) >= 4:
        bins: dict[str, list[tuple[int, int, float]]] = {}
        for name, b, count, total in conn.execute("SELECT name, bin, count, total FROM phase_hist"):
            bins.setdefault(name, []).append((b, count, total))
        return {name: phase_hist.summary(count, maximum, bins.get(name, []))
                for name, count, maximum in
                conn.execute("SELECT name, count, max FROM phase_stats ORDER BY name")}
    durations: dict[str, list[float]] = {}
    for row in conn.execute("SELECT name, ended_at - started_at AS d FROM phases"):
        durations.setdefault(row["name"], []).append(row["d"])
    return {name: {"count": len(v), "median": round(statistics.median(v), 4),
                   "p95": round(_p95(v), 4), "max": round(max(v), 4)}
            for name, v in sorted(durations.items())}
