"""The relay's line splitter and outbox: linear, bounded, never blocking, never losing control
records."""
from __future__ import annotations

import os

import pytest

from stalldoc.run import channel
from stalldoc.run.channel import LINE_LIMIT, LineSplitter, Outbox, RecordReader


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


def test_outbox_lets_its_oldest_output_go_past_its_limit_but_never_control_records(monkeypatch):
    monkeypatch.setattr(channel, "OUTBOX_LIMIT", 200_000)
    monkeypatch.setattr(channel, "BATCH_BYTES", 20_000)
    read_fd, write_fd = os.pipe()
    outbox = Outbox(write_fd)
    # GIVEN a reader that does not read: the pipe fills, then the outbox up to its limit, with
    # a control record (a reaped rank) in the middle of the output
    for i in range(2_000):
        outbox.chunk("stdout", 1.5, b"".join(b"line %07d %s\n" % (i * 10 + j, b"x" * 40)
                                             for j in range(10)))
        if i == 1_000:
            outbox.control("X 4242 9")
    outbox.control("E 0 0")
    assert outbox.dropped > 0 and outbox.waiting
    # WHEN the reader catches up, decoding reads cut anywhere
    reader, records = RecordReader(), []
    while True:
        outbox.flush()
        data = os.read(read_fd, 1 << 20)
        for start in range(0, len(data), 7777):
            records += reader.feed(data[start:start + 7777])
        if not outbox.waiting and records and records[-1].kind == "E":
            break
    # THEN the lines kept arrived whole and in order, the newest of them all among them; each
    # jump comes after a gap record; the dropped ones are counted; no control record was lost
    splitter, numbers, after_gap = LineSplitter(), [], set()
    for record in records:
        if record.kind == "G":
            splitter = LineSplitter()
            after_gap.add(len(numbers))
        elif record.kind == "C":
            numbers += [int(line.split()[1]) for line in splitter.feed(record.payload)]
    assert len(numbers) + outbox.dropped == 20_000
    assert numbers == sorted(numbers) and numbers[-1] == 19_999
    jumps = {i + 1 for i, (a, b) in enumerate(zip(numbers, numbers[1:])) if b != a + 1}
    assert jumps and jumps <= after_gap
    assert [r.kind for r in records if r.kind not in "CG"] == ["X", "E"]
    assert records[-1].fields == ("0", "0")


def test_output_after_a_drop_is_marked_as_a_gap(monkeypatch):
    monkeypatch.setattr(channel, "OUTBOX_LIMIT", 10_000)
    read_fd, write_fd = os.pipe()
    outbox = Outbox(write_fd)
    # GIVEN output dropped while nobody read (the pipe full, the outbox past its limit)
    while not outbox.dropped:
        outbox.chunk("stderr", 1.0, b"y" * 30_000 + b"\n")
    outbox.chunk("stderr", 1.1, b"half a li")
    # WHEN the batch went out, the reader caught up, and the job goes on
    outbox.pack()
    reader, records = RecordReader(), []
    while outbox.waiting:
        records += reader.feed(os.read(read_fd, 1 << 20))
        outbox.flush()
    outbox.chunk("stderr", 1.2, b"ne\nwhole\n")
    outbox.pack()   # the batch is due
    records += reader.feed(os.read(read_fd, 1 << 20))
    # THEN the next chunk comes after a gap record, so the half line is not glued to it
    assert [r.kind for r in records[-2:]] == ["G", "C"]
    assert records[-2].fields == ("stderr",) and records[-1].payload == b"ne\nwhole\n"


def test_small_writes_are_handed_over_in_one_batch_per_stream():
    read_fd, write_fd = os.pipe()
    outbox = Outbox(write_fd)
    # GIVEN a job writing line by line (unbuffered), on both streams
    for i in range(1000):
        outbox.chunk("stdout", 10.0 + i / 1000, b"step %d\n" % i)
    outbox.chunk("stderr", 10.5, b"warning\n")
    assert outbox.due(10.0) == pytest.approx(channel.BATCH_SECONDS)   # not yet
    assert outbox.due(11.0) == 0.0
    # WHEN the batch is due
    outbox.pack()
    records = RecordReader().feed(os.read(read_fd, 1 << 20))
    # THEN one record per stream, stamped with its first write, every byte in order
    assert [(r.kind, r.fields[0]) for r in records] == [("C", "stdout"), ("C", "stderr")]
    assert records[0].fields[1] == "10.000000"
    assert records[0].payload == b"".join(b"step %d\n" % i for i in range(1000))


def test_outbox_to_a_dead_reader_gives_up_quietly():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    outbox = Outbox(write_fd)
    outbox.chunk("stderr", 2.0, b"after the sidecar died\n")
    outbox.control("T")
    assert outbox.broken and not outbox.waiting
