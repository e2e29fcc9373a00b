from __future__ import annotations

import pytest

from stalldoc.agent import statefile
from stalldoc.agent.state_reader import StateFileError, parse_state, read_state
from stalldoc.agent.statefile import StateWriter


def test_written_fields_read_back(tmp_path):
    path = str(tmp_path / "agent-1.state")
    writer = StateWriter(path, pid=1234, rank=3, local_rank=1, world_size=8, now=100.0)
    writer.heartbeat(105.5)
    writer.marker(7, 104.0)
    writer.phase_stack(["step", "rollout"])
    for n in range(1, 40):
        writer.phase_done(n, f"p{n}", float(n), n + 0.5)
    writer.group_ring(0, "world")
    state = read_state(path)
    assert (state.pid, state.rank, state.local_rank, state.world_size) == (1234, 3, 1, 8)
    assert (state.heartbeat_at, state.marker_seq, state.last_marker_at) == (105.5, 7, 104.0)
    assert state.phase_stack == ("step", "rollout")
    assert state.phases_completed == 39
    assert [p.name for p in state.phases] == [f"p{n}" for n in range(8, 40)]  # the newest 32
    assert state.groups[0].name == "world" and state.groups[0].ring == ()
    writer.status(statefile.STATUS_EXITED, exit_code=3)
    assert read_state(path).exit_code == 3


def test_foreign_and_newer_files_are_refused(tmp_path):
    path = tmp_path / "x.state"
    StateWriter(str(path), 1, 0, 0, 1, 0.0).close()
    data = bytearray(path.read_bytes())
    data[4] = 99
    with pytest.raises(StateFileError, match="version 99"):
        parse_state(bytes(data))
    with pytest.raises(StateFileError, match="bad magic"):
        parse_state(b"XXXX" + bytes(data[4:]))
    with pytest.raises(StateFileError, match="expected"):
        parse_state(b"short")


def test_collective_ring_counts_wrap_and_in_flight_entries(tmp_path):
    path = str(tmp_path / "agent-2.state")
    writer = StateWriter(path, pid=2, rank=0, local_rank=0, world_size=2, now=0.0)
    world, other = writer.group_ring(0, "world"), writer.group_ring(1, "tp")
    for n in range(1, 101):  # wraps the 64-slot ring
        entry = world.enter(b"all_reduce", n, b"float32", 0, float(n))
        world.exit(entry, n + 0.5)
    stuck = world.enter(b"all_gather", 7, b"bfloat16", statefile.FLAG_ASYNC, 200.0)
    other.enter(b"broadcast", 3, b"int64", 0, 300.0)
    groups = {g.name: g for g in read_state(path).groups}
    assert (groups["world"].started, groups["world"].completed) == (101, 100)
    ring = groups["world"].ring
    assert [r.seq for r in ring] == list(range(101 - statefile.RING_SLOTS + 1, 102))
    assert (ring[-1].op, ring[-1].numel, ring[-1].dtype, ring[-1].is_async) == (
        "all_gather", 7, "bfloat16", True)
    assert not ring[-1].completed and ring[-2].completed_at == 100.5
    assert (groups["tp"].started, groups["tp"].completed, groups["tp"].ring[0].op) == (
        1, 0, "broadcast")
    world.exit(stuck, 201.0)
    assert read_state(path).groups[0].completed == 101
