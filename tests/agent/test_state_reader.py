"""The watcher's incremental read of the collective rings: only what is new since the last read
is decoded, and what the ring overwrote before it could be read is counted exactly."""
from __future__ import annotations

import random
import struct

import pytest

from stalldoc.agent import statefile
from stalldoc.agent.state_reader import IncrementalReader, StateFileError, read_state
from stalldoc.agent.statefile import RING_SLOTS, GroupRing, StateWriter


def _issue(ring: GroupRing, count: int, pending_last: bool = False) -> int:
    """``count`` collectives into ``ring``; the offset of the last one's entry."""
    offset = 0
    for n in range(count):
        offset = ring.enter(b"all_reduce", ring.started + 1, b"float32", 0, float(ring.started))
        if not (pending_last and n == count - 1):
            ring.exit(offset, ring.started + 0.5)
    return offset


@pytest.fixture
def state(tmp_path):
    path = str(tmp_path / "agent-7.state")
    writer = StateWriter(path, pid=7, rank=0, local_rank=0, world_size=1, now=1.0)
    yield path, writer
    writer.close()


def test_each_read_equals_a_full_read_and_nothing_is_lost_below_the_ring_size(state):
    path, writer = state
    ring, reader = writer.group_ring(0, "world"), IncrementalReader()
    rng = random.Random(3)
    seen: set[int] = set()
    for _ in range(40):
        _issue(ring, rng.randint(0, RING_SLOTS), pending_last=rng.random() < 0.3)
        incremental = reader.read(path)
        assert incremental.groups == read_state(path).groups
        seen |= {r.seq for r in incremental.groups[0].ring}
        assert incremental.groups[0].wrapped == 0
    assert seen == set(range(1, ring.started + 1))


def test_what_wraps_between_two_reads_is_counted_exactly(state):
    path, writer = state
    ring, reader = writer.group_ring(0, "world"), IncrementalReader()
    _issue(ring, 10)
    assert reader.read(path).groups[0].wrapped == 0
    _issue(ring, 1000)
    group = reader.read(path).groups[0]
    assert group.wrapped == 1000 - RING_SLOTS
    assert [r.seq for r in group.ring] == list(range(1010 - RING_SLOTS + 1, 1011))
    _issue(ring, 5)
    group = reader.read(path).groups[0]
    assert (group.wrapped, group.started, group.ring[-1].seq) == (1000 - RING_SLOTS, 1015, 1015)


def test_the_first_read_counts_nothing_that_came_before_it(state):
    """The watcher was not looking before its first read: the ring's older entries are not
    counted as lost. A group that appears after the first read is counted from its start."""
    path, writer = state
    _issue(writer.group_ring(0, "world"), 500)
    reader = IncrementalReader()
    assert reader.read(path).groups[0].wrapped == 0
    _issue(writer.group_ring(1, "tp"), 300)
    tp = reader.read(path).groups[1]
    assert (tp.name, tp.started, tp.wrapped) == ("tp", 300, 300 - RING_SLOTS)
    assert read_state(path).groups[1].wrapped == 0     # a one-shot read counts nothing


def test_a_pending_collective_is_read_again_until_it_completes(state):
    path, writer = state
    ring, reader = writer.group_ring(0, "world"), IncrementalReader()
    stuck = _issue(ring, 3, pending_last=True)
    group = reader.read(path).groups[0]
    assert (group.completed, group.ring[-1].completed) == (2, False)
    ring.exit(stuck, 99.0)
    group = reader.read(path).groups[0]
    assert (group.completed, group.ring[-1].completed_at) == (3, 99.0)


def test_an_entry_already_read_is_not_decoded_again(state):
    """An entry the reader has read is kept, not decoded again: damaging it afterwards is seen
    by a full read (refused) and not by the incremental one."""
    path, writer = state
    ring, reader = writer.group_ring(0, "world"), IncrementalReader()
    _issue(ring, 4)
    reader.read(path)
    with open(path, "r+b") as fh:
        fh.seek(statefile.entry_offset(0, 2) + 8)    # numel of collective 2
        fh.write(struct.pack("<Q", 2**60))
    with pytest.raises(StateFileError, match="numel"):
        read_state(path)
    _issue(ring, 2)
    group = reader.read(path).groups[0]
    assert ([r.seq for r in group.ring], group.ring[1].numel) == ([1, 2, 3, 4, 5, 6], 2)


def test_a_new_agent_under_the_same_path_starts_afresh(state, tmp_path):
    path, writer = state
    reader = IncrementalReader()
    _issue(writer.group_ring(0, "world"), 200)
    reader.read(path)
    again = StateWriter(path, pid=7, rank=0, local_rank=0, world_size=1, now=2.0)
    _issue(again.group_ring(0, "world"), 3)
    group = reader.read(path).groups[0]
    assert ([r.seq for r in group.ring], group.wrapped) == ([1, 2, 3], 0)
    again.close()
