"""The HTML report's timeline and curves from run records: phases the ticks saw outside the
stored spans, collectives completed or not, kills, the cap on bars, CUDA curves. (Collectives
are not stored yet by any released schema: their records are built here directly.)"""
from __future__ import annotations

from dataclasses import replace

import pytest

from support import run_record as _run
from stalldoc.report.formats import html_timeline
from stalldoc.report.formats.html_charts import curve_charts, cuda_memory
from stalldoc.report.formats.html_timeline import MAX_BARS, build_timeline
from stalldoc.report.records import (CollectiveSpan, PhaseSpan, RankPoint, Report,
                                     StallRecord, TimeSeries)

T0 = 1_700_000_000.0


def test_the_phase_a_rank_stalled_in_comes_from_the_ticks_after_its_last_span():
    spans = (PhaseSpan(0, "step", T0 + 1, T0 + 2), PhaseSpan(0, "data", T0 + 2, T0 + 3))
    ticks = tuple(RankPoint(T0 + t, 0, phase="step" if t < 4 else "data") for t in range(1, 10))
    timeline = build_timeline(Report((_run(spans=spans, timeseries=TimeSeries(ticks)),)))
    bars = [(b.name, b.start, b.end, b.open) for b in timeline.phases]
    # the spans as stored; the ticks only beyond them, to the rank's exit
    assert bars == [("step", 1, 2, False), ("data", 2, 3, False), ("step", 3, 4, True),
                    ("data", 4, 19, True)]


def test_collectives_completed_and_not_and_kills_by_stalldoc():
    collectives = (CollectiveSpan(0, "world", 7, "all_reduce", 1024, "float32", T0 + 5, T0 + 6),
                   CollectiveSpan(1, "world", 8, "all_reduce", 1024, "float32", T0 + 7, None))
    timeline = build_timeline(Report((_run(collectives=collectives),)))
    done, waiting = timeline.collectives
    assert (done.name, done.end, done.open) == ("all_reduce #7 (world)", 6, False)
    assert (waiting.start, waiting.end, waiting.open) == (7, 19, True)   # until the rank died
    assert "not completed" in waiting.hover and "1024 x float32" in waiting.hover
    assert {(m.row, m.kind) for m in timeline.marks} == {("rank 0", "killed"),
                                                         ("rank 1", "killed")}
    assert "exit 137 (SIGKILL), ended by stalldoc" in timeline.marks[0].hover


def test_a_long_run_merges_bars_far_from_stalls_into_time_bins():
    spans = tuple(PhaseSpan(0, "step" if i % 3 else "rollout", T0 + i, T0 + i + 0.9)
                  for i in range(3 * MAX_BARS))
    stall = StallRecord(1, T0 + 100, T0 + 110, T0 + 120, 10, (0,))
    timeline = build_timeline(Report((_run(spans=spans, stalls=(stall,)),)))
    bars = timeline.phases
    assert len(bars) <= MAX_BARS + 80 and timeline.thinned == 3 * MAX_BARS - len(bars)
    # THEN around the stall (30 s either side) every span is as it was
    near = [b for b in bars if 70 <= b.start <= 150]
    assert [(b.start, b.name) for b in near] == [(float(i), "step" if i % 3 else "rollout")
                                                 for i in range(70, 151)]
    # AND elsewhere one bar per bin covers the run to its end, named after its larger part
    far = [b for b in bars if b.start > 200]
    assert all("merged" in b.hover and b.name == "step" for b in far)
    assert max(b.end for b in bars) == pytest.approx(3 * MAX_BARS - 1 + 0.9)
    assert [b.start for b in bars] == sorted(b.start for b in bars)


def test_merged_rows_are_node_qualified():
    a, b = _run(), _run(node="b")
    b = replace(b, ranks=tuple(replace(r, rank=r.rank + 2, node="b") for r in b.ranks))
    a = replace(a, ranks=tuple(replace(r, node="a") for r in a.ranks), node="a")
    timeline = build_timeline(Report((a, b)))
    assert timeline.rows == ("rank 0 (a)", "rank 1 (a)", "rank 2 (b)", "rank 3 (b)")


def test_cuda_curves_appear_only_with_allocator_samples():
    points = tuple(RankPoint(T0 + t, 0, cuda_allocated=t * 2**30, cuda_reserved=2 * t * 2**30)
                   for t in range(3))
    report = Report((_run(timeseries=TimeSeries(points)),))
    series = {name: ys for name, _, ys in cuda_memory(report, T0)}
    assert series == {"rank 0 allocated": [0, 1, 2], "rank 0 reserved": [0, 2, 4]}
    titles = [c.title for c in curve_charts(report, T0, 20)]
    assert titles == ["CUDA allocator per rank"]
    assert curve_charts(Report((_run(),)), T0, 20) == []


def test_signal_names():
    assert html_timeline.signal_name(15) == "SIGTERM"
    assert html_timeline.signal_name(None) == "" and html_timeline.signal_name(99) == "signal 99"
