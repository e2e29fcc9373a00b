"""Phase durations over a run: count, median, p95 and maximum per phase name; and where each
rank's cycles went, by kind of phase."""
from __future__ import annotations

import sqlite3
import statistics

from stalldoc.analysis.phase_shares import MIN_CYCLES, SHARE_NAMES, StepShares, step_shares
from stalldoc.model.agent import PhaseKinds
from stalldoc.report import telemetry
from stalldoc.report.records import StepShareRecord
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


def step_share_records(conn: sqlite3.Connection) -> tuple[StepShareRecord, ...]:
    """Each rank's shares over its whole run (every complete cycle but the first) and over its
    last 3 cycles, from the reads stored near each cycle's start (schema 8 on); of a rank
    started again, its last process's."""
    if telemetry.version(conn) < 8:
        return ()
    out = []
    for rank, reads in sorted(_kind_reads(conn).items()):
        reads = _last_process(reads)
        for over, shares in (("run", step_shares(rank, reads, None)),
                             ("last", step_shares(rank, reads, MIN_CYCLES))):
            if shares is not None:
                out.append(_record(over, shares))
    return tuple(out)


def _kind_reads(conn: sqlite3.Connection) -> dict[int, list[PhaseKinds]]:
    rows: dict[tuple[int, float], list[tuple[str, int, float]]] = {}
    for rank, at, kind, entries, seconds in conn.execute(
            "SELECT rank, counted_at, kind, entries, seconds FROM phase_kinds "
            "ORDER BY rank, counted_at"):
        rows.setdefault((rank, at), []).append((kind, entries, seconds))
    reads: dict[int, list[PhaseKinds]] = {}
    order = {kind: i for i, kind in enumerate(SHARE_NAMES)}   # the agent's kinds, in order
    for (rank, at), kinds in rows.items():
        kinds.sort(key=lambda row: order.get(row[0], len(order)))
        reads.setdefault(rank, []).append(PhaseKinds(at, tuple((k, n) for k, n, _ in kinds),
                                                     tuple((k, t) for k, _, t in kinds)))
    return reads


def _last_process(reads: list[PhaseKinds]) -> list[PhaseKinds]:
    starts = [i for i in range(1, len(reads)) if reads[i].restarted(reads[i - 1])]
    return reads[starts[-1]:] if starts else reads


def _record(over: str, shares: StepShares) -> StepShareRecord:
    return StepShareRecord(shares.rank, over, shares.cycle_kind, shares.cycles,
                           round(shares.cycle_seconds, 3),
                           {name: round(share, 4) for name, share in shares.shares},
                           round(shares.entered("weight_sync") / shares.cycles, 1))
