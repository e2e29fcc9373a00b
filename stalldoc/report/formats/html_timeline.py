"""What the HTML report's timeline shows, as plain records: one row per rank (node-qualified
when merged) with its phases, collectives, exits, kills and findings, and the stalls as shaded
spans. Times are seconds since the report's start. No Plotly here (``html_charts.py`` draws)."""
from __future__ import annotations

import signal
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator

from stalldoc.report.records import RankPoint, RankRecord, Report, RunRecord

MAX_BARS = 1500   # per row and kind; beyond, bars far from stalls are merged into time bins
NEAR_STALL = 30.0  # seconds around a stall whose bars are never merged


@dataclass(frozen=True)
class Bar:
    """A phase or a collective of one row, from ``start`` to ``end``."""

    row: str
    name: str
    start: float
    end: float
    hover: str
    open: bool = False      # still in it when last seen (a phase) / never completed (a collective)


@dataclass(frozen=True)
class Mark:
    """A moment on one row: ``kind`` is "exit", "killed" (by stalldoc) or "finding"."""

    row: str
    t: float
    kind: str
    hover: str


@dataclass(frozen=True)
class Shade:
    """A stall: no work seen from ``start``, declared at ``detected``, over at ``end``."""

    start: float
    detected: float
    end: float
    label: str
    ended: bool


@dataclass(frozen=True)
class Timeline:
    origin: float                 # wall-clock time of x = 0
    end: float                    # seconds: the last thing seen
    rows: tuple[str, ...]         # top to bottom
    phases: tuple[Bar, ...]
    collectives: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    stalls: tuple[Shade, ...]
    thinned: int = 0              # bars merged into others (MAX_BARS)


def row_label(rank: int, node: str, merged: bool) -> str:
    return f"rank {rank} ({node})" if merged else f"rank {rank}"


def signal_name(number: int | None) -> str:
    try:
        return signal.Signals(number).name if number else ""
    except ValueError:
        return f"signal {number}"


def exit_text(rank: RankRecord) -> str:
    code = "unknown" if rank.exit_code is None else str(rank.exit_code)
    name = signal_name(rank.signal)
    return f"exit {code}" + (f" ({name})" if name else "")


def report_end(report: Report) -> float:
    """The last wall-clock time anything of the report was seen."""
    times = [report.started_at]
    for run in report.runs:
        times += [t for t in (run.info.ended_at,) if t]
        times += [p.t for p in run.timeseries.ranks[-1:]] + [p.t for p in run.timeseries.node[-1:]]
        times += [r.ended_at or r.first_seen for r in run.ranks]
        times += [s.ended_at or s.detected_at for s in run.stalls]
    return max(times)


def build_timeline(report: Report) -> Timeline:
    origin, merged = report.started_at, report.merged
    end = report_end(report)
    rows = tuple(dict.fromkeys(row_label(r.rank, r.node, merged) for r in report.ranks))
    phases: list[Bar] = []
    collectives: list[Bar] = []
    marks: list[Mark] = []
    for run in report.runs:
        phases += phase_bars(run, origin, end, merged)
        collectives += collective_bars(run, origin, end, merged)
        marks += exit_marks(run, origin, merged) + finding_marks(run, origin, merged)
        rows += tuple(row for row in _rows_of(run, merged) if row not in rows)
    near = [(s.started_at - origin - NEAR_STALL, (s.ended_at or end) - origin + NEAR_STALL)
            for s in report.stalls]
    kept_phases, thinned_phases = thin(phases, near)
    kept_collectives, thinned_collectives = thin(collectives, near)
    return Timeline(origin, end - origin, rows, kept_phases, kept_collectives, tuple(marks),
                    tuple(stall_shades(report, origin, end)),
                    thinned_phases + thinned_collectives)


def _rows_of(run: RunRecord, merged: bool) -> Iterator[str]:
    """Rows for ranks seen only in spans or ticks (no process record)."""
    for rank in sorted({s.rank for s in run.spans} | {p.rank for p in run.timeseries.ranks}):
        yield row_label(rank, run.node, merged)


def thin(bars: list[Bar], keep: list[tuple[float, float]]) -> tuple[tuple[Bar, ...], int]:
    """Rows of more than MAX_BARS bars: those near a stall (``keep``) as they are, the others
    merged into MAX_BARS time bins; and how many bars were merged away."""
    by_row: dict[str, list[Bar]] = defaultdict(list)
    for bar in bars:
        by_row[bar.row].append(bar)
    kept: list[Bar] = []
    for row_bars in by_row.values():
        if len(row_bars) <= MAX_BARS:
            kept += row_bars
            continue
        close = [any(b.end >= a and b.start <= z for a, z in keep) for b in row_bars]
        near = [b for b, c in zip(row_bars, close) if c]
        far = [b for b, c in zip(row_bars, close) if not c]
        kept += near + binned(far) if len(near) <= MAX_BARS else binned(row_bars)
    kept.sort(key=lambda b: (b.row, b.start))
    return tuple(kept), len(bars) - len(kept)


def binned(bars: list[Bar]) -> list[Bar]:
    """MAX_BARS bars at most: those starting in one time bin become one bar, named after what
    took most of its time; its hover says what was merged."""
    if not bars:
        return []
    lo, hi = min(b.start for b in bars), max(b.end for b in bars)
    width = max(hi - lo, 1e-9) / MAX_BARS
    bins: dict[int, list[Bar]] = defaultdict(list)
    for bar in bars:
        bins[min(int((bar.start - lo) / width), MAX_BARS - 1)].append(bar)
    return [group[0] if len(group) == 1 else _merged(group) for group in bins.values()]


def _merged(group: list[Bar]) -> Bar:
    seconds: dict[str, float] = defaultdict(float)
    for bar in group:
        seconds[bar.name] += bar.end - bar.start
    top = sorted(seconds.items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{name} {secs:.1f} s" for name, secs in top[:3])
    first = group[0]
    return Bar(first.row, top[0][0], min(b.start for b in group), max(b.end for b in group),
               f"{len(group)} merged (zoomed out): {parts}" + (", ..." if len(top) > 3 else ""),
               any(b.open for b in group))


def phase_bars(run: RunRecord, origin: float, end: float, merged: bool) -> list[Bar]:
    """The ended phases (spans), and the phases the ticks saw outside them (the one a rank was
    still in when it stalled or died)."""
    bars = [Bar(row_label(s.rank, run.node, merged), s.name, s.started_at - origin,
                s.ended_at - origin, f"{s.name}: {s.ended_at - s.started_at:.3f} s")
            for s in run.spans]
    covered: dict[int, tuple[float, float]] = {}
    for s in run.spans:
        lo, hi = covered.get(s.rank, (s.started_at, s.ended_at))
        covered[s.rank] = (min(lo, s.started_at), max(hi, s.ended_at))
    for rank, name, start, stop in tick_phases(run.timeseries.ranks, run.ranks, end):
        lo, hi = covered.get(rank, (stop, stop))
        for a, b in ((start, min(stop, lo)), (max(start, hi), stop)):
            if b > a:
                bars.append(Bar(row_label(rank, run.node, merged), name, a - origin, b - origin,
                                f"{name}: {b - a:.1f} s or more (seen at the ticks)", True))
    return bars


def tick_phases(points: Iterable[RankPoint], ranks: Iterable[RankRecord],
                end: float) -> Iterator[tuple[int, str, float, float]]:
    """(rank, phase, from, to): runs of ticks that saw a rank in one phase."""
    ended = {r.rank: r.ended_at for r in ranks if r.ended_at}
    by_rank: dict[int, list[RankPoint]] = defaultdict(list)
    for point in points:
        by_rank[point.rank].append(point)
    for rank, series in by_rank.items():
        series.sort(key=lambda p: p.t)
        stop_at = ended.get(rank, end)
        run_start, name = 0.0, ""
        for i, point in enumerate(series + [RankPoint(stop_at, rank)]):
            phase = point.phase or ""
            if i and phase == name:
                continue
            if name:
                yield rank, name, run_start, point.t
            run_start, name = point.t, phase


def collective_bars(run: RunRecord, origin: float, end: float, merged: bool) -> list[Bar]:
    ended = {r.rank: r.ended_at for r in run.ranks if r.ended_at}
    bars = []
    for c in run.collectives:
        stop = c.completed_at or ended.get(c.rank, end)
        state = (f"{c.completed_at - c.entered_at:.3f} s" if c.completed_at
                 else "not completed")
        bars.append(Bar(row_label(c.rank, run.node, merged), f"{c.op} #{c.seq} ({c.group})",
                        c.entered_at - origin, max(stop, c.entered_at) - origin,
                        f"{c.op} #{c.seq} ({c.group}) {c.numel} x {c.dtype}: {state}",
                        c.completed_at is None))
    return bars


def exit_marks(run: RunRecord, origin: float, merged: bool) -> list[Mark]:
    killed = run.info.ended_by == "stalldoc"
    return [Mark(row_label(r.rank, run.node, merged), r.ended_at - origin,
                 "killed" if killed else "exit",
                 f"rank {r.rank} ended: {exit_text(r)}"
                 + (", ended by stalldoc (--on-stall kill)" if killed else ""))
            for r in run.ranks if r.ended_at]


def finding_marks(run: RunRecord, origin: float, merged: bool) -> list[Mark]:
    return [Mark(row_label(rank, run.node, merged), f.t - origin, "finding",
                 f"{f.code} {f.severity}: {f.summary}")
            for f in run.findings if f.trigger != "launch" for rank in f.ranks]


def stall_shades(report: Report, origin: float, end: float) -> Iterator[Shade]:
    for s in report.stalls:
        where = f" ({s.node})" if report.merged else ""
        yield Shade(s.started_at - origin, s.detected_at - origin,
                    (s.ended_at or end) - origin, f"stall #{s.id}{where}", s.ended_at is not None)
