"""The sidecar's log feed holds a bounded number of lines between ticks."""
from __future__ import annotations

from stalldoc.sidecar import log_feed
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.model.samples import LogLine


def test_a_burst_past_the_queue_is_counted_not_kept(monkeypatch):
    monkeypatch.setattr(log_feed, "QUEUE_LINES", 100)
    feed = LogFeed()
    for i in range(130):
        feed.put(LogLine(float(i), "stdout", f"step {i}"))
    drained = feed.drain()
    assert [line.text for line in drained.lines] == [f"step {i}" for i in range(100)]
    assert feed.dropped == 30
    feed.put(LogLine(200.0, "stdout", "after the tick"))   # room again once drained
    assert [line.text for line in feed.drain().lines] == ["after the tick"]
