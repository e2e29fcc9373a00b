"""The sidecar's log feed holds a bounded number of lines between ticks."""
from __future__ import annotations

from stalldoc.sidecar import log_feed
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.model.samples import LogLine


def test_a_burst_past_the_queue_keeps_its_newest_lines_and_counts_the_others(monkeypatch):
    monkeypatch.setattr(log_feed, "QUEUE_LINES", 100)
    feed = LogFeed()
    for i in range(130):
        feed.put(LogLine(float(i), "stdout", f"step {i}"))
    drained = feed.drain()
    assert [line.text for line in drained.lines] == [f"step {i}" for i in range(30, 130)]
    assert feed.dropped == 30
    feed.put(LogLine(200.0, "stdout", "after the tick"))
    assert [line.text for line in feed.drain().lines] == ["after the tick"]


def test_a_tick_reads_the_job_output_for_a_bounded_time(monkeypatch):
    # GIVEN a flood waiting, and a clock that moves 1 ms each time it is read
    clock = iter(range(10**6))
    monkeypatch.setattr(log_feed.time, "monotonic", lambda: next(clock) / 1000)
    feed = LogFeed()
    for i in range(2_000):
        feed.put(LogLine(float(i), "stdout", f"INFO reloaded weight {i}"))
    # WHEN a tick may spend 2 ms on it, THEN it stops at its first look past that time, and
    # the rest waits, in order, for the next tick (the last drain reads all)
    first = feed.drain(0.002)
    assert len(first.lines) == 3 * log_feed.CLOCK_EVERY and first.left == 2_000 - len(first.lines)
    rest = feed.drain()
    assert [line.text for line in first.lines + rest.lines] == [
        f"INFO reloaded weight {i}" for i in range(2_000)] and rest.left == 0


def test_a_coloured_line_is_kept_in_words():
    # GIVEN Ray's autoscaler line as Ray 2.60 printed it, and a progress bar's cursor moves
    feed = LogFeed()
    feed.put(LogLine(1.0, "stderr", "\x1b[33m(autoscaler +5s)\x1b[0m Error: No available node "
                     "types can fulfill resource request {'GPU': 2.0}."))
    feed.put(LogLine(2.0, "stderr", "\x1b[A\x1b[2Kstep 3/10\x1b[0m"))
    # WHEN the tick drains them
    lines = [line.text for line in feed.drain().lines]
    # THEN the store, the rules and the report see the words alone
    assert lines == ["(autoscaler +5s) Error: No available node types can fulfill resource "
                     "request {'GPU': 2.0}.", "step 3/10"]
