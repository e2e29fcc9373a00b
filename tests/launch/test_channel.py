"""The relay's line splitter and outbox: linear, bounded, never blocking, never losing control
records."""
from __future__ import annotations

import os

from stalldoc.launch import channel
from stalldoc.launch.channel import LINE_LIMIT, LineSplitter, Outbox, parse_relay_record


def test_lines_are_cut_across_chunks_and_carriage_returns():
    splitter = LineSplitter()
    assert splitter.feed(b"loss 0.5\nste") == [b"loss 0.5"]
    assert splitter.feed(b"p 2\r 40%|##\r 50%|###") == [b"step 2", b" 40%|##"]
    assert splitter.close() == [b" 50%|###"]


def test_a_line_without_end_is_kept_only_up_to_the_limit():
    # GIVEN 20 MB without a newline, in the relay's 64 kB reads
    splitter = LineSplitter()
    chunk = b"x" * 65536
    for _ in range(320):
        assert splitter.feed(chunk) == []
        assert len(splitter._open) <= LINE_LIMIT     # bounded while it grows
    # WHEN it ends, THEN one line comes out, cut at the limit, and the next line is whole
    assert splitter.feed(b"tail\nnext\n") == [b"x" * LINE_LIMIT, b"next"]


def test_outbox_drops_lines_past_its_limit_but_never_control_records(monkeypatch):
    monkeypatch.setattr(channel, "OUTBOX_LIMIT", 200_000)
    read_fd, write_fd = os.pipe()
    outbox = Outbox(write_fd)
    # GIVEN a reader that does not read: the pipe fills, then the outbox up to its limit
    for i in range(20_000):
        outbox.lines("stdout", 1.5, [b"line %06d " % i + b"x" * 40])
        outbox.flush()
    outbox.control("E 0 0")
    assert outbox.dropped > 0 and outbox.waiting
    # WHEN the reader catches up
    data = b""
    while True:
        outbox.flush()
        chunk = os.read(read_fd, 1 << 20)
        data += chunk
        if not outbox.waiting and data.endswith(b"E 0 0\n"):
            break
    records = [parse_relay_record(raw) for raw in data.split(b"\n") if raw]
    lines = [r for r in records if r and r.kind == "L"]
    # THEN every line kept arrived whole and in order, the dropped ones are counted, and the
    # control record came last
    assert len(lines) + outbox.dropped == 20_000
    assert [int(r.text.split()[1]) for r in lines] == list(range(len(lines)))
    assert records[-1] is not None and records[-1].kind == "E"


def test_outbox_to_a_dead_reader_gives_up_quietly():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    outbox = Outbox(write_fd)
    outbox.lines("stderr", 2.0, [b"after the sidecar died"])
    outbox.control("T")
    assert outbox.broken and not outbox.waiting
