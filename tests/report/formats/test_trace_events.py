"""Trace Event building blocks: slices that only partly overlap go to lanes of their own (the
format wants slices on a thread to nest), flows bind to their slices; and the rules check used
by the perfetto tests finds what breaks the format."""
from __future__ import annotations

from trace_consumers import trace_errors
from stalldoc.report.formats.trace_events import (MAX_LANES, Slice, complete, counter, flow,
                                                  lanes)


def test_slices_that_overlap_without_nesting_get_lanes_of_their_own():
    a, b, c, d = (Slice(0, 10, "a", "x"), Slice(2, 3, "b", "x"), Slice(5, 10, "c", "x"),
                  Slice(10, 1, "d", "x"))
    packed, left_out = lanes([d, c, b, a])
    assert packed == [[a, b, d], [c]] and left_out == 0
    events = [complete(1, tid + 1, s) for tid, lane in enumerate(packed) for s in lane]
    assert trace_errors({"traceEvents": events}) == []
    assert trace_errors({"traceEvents": [complete(1, 1, s) for s in (a, c)]}) == [
        "'c' on (1, 1) overlaps 'a' without nesting"]


def test_lanes_are_bounded():
    packed, left_out = lanes(Slice(i, 100, str(i), "x") for i in range(MAX_LANES + 5))
    assert len(packed) == MAX_LANES and left_out == 5


def test_flows_bind_to_their_slices_and_the_rules_catch_broken_ones():
    first, second, third = (Slice(0, 5, "all_reduce #1", "collective"),
                            Slice(1, 4, "all_reduce #1", "collective"),
                            Slice(2, 3, "all_reduce #1", "collective"))
    chain = [(1, 1, first), (2, 1, second), (3, 1, third)]
    events = [complete(pid, tid, s) for pid, tid, s in chain] + flow(chain, 7, "#1")
    assert [e["ph"] for e in events[3:]] == ["s", "t", "f"]
    assert trace_errors({"traceEvents": events}) == []
    assert trace_errors({"traceEvents": events[:3] + events[3:5]}) == ["flow 7: phases 'st'"]
    moved = dict(events[5], ts=2.5)
    assert trace_errors({"traceEvents": events[:5] + [moved]}) == [
        "flow 7: f bound to no slice"]


def test_counters_take_numbers_only():
    assert counter(1, 0, "memory", {"rss": None}) is None
    assert counter(1, 0, "memory", {"rss": 1.5, "gpu": None})["args"] == {"rss": 1.5}
    bad = {"ph": "C", "pid": 1, "ts": 0, "name": "m", "args": {"rss": "1 GiB"}}
    assert trace_errors({"traceEvents": [bad]}) == [
        "event 0 (C): counter with a value that is not a number"]
