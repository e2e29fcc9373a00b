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


def test_phase_detail_and_engine_sleep_states_read_back(tmp_path):
    path = str(tmp_path / "agent-3.state")
    writer = StateWriter(path, pid=3, rank=1, local_rank=1, world_size=2, now=0.0)
    writer.phase_stack(["step", "weight_sync"])
    writer.phase_detail("weight_sync", 50.0, "update_named_param\tserver\t10.0.0.5:8000")
    writer.engine(1, 2**64 - 1, 3, 2, statefile.ENGINE_PARTLY_AWAKE, 2, statefile.TAG_WEIGHTS,
                  40.0, 45.0)
    state = read_state(path)
    assert state.channel == state.phase_detail
    assert state.phase_detail.describe() == "update_named_param, server 10.0.0.5:8000"
    assert state.phase_detail.since == 50.0
    [engine] = state.engines
    assert (engine.engine, engine.state, engine.level, engine.sleeps, engine.wakes) == (
        "engine 2", "partly awake", 2, 3, 2)
    assert (engine.asleep_at, engine.woken_at, engine.woken_tags) == (40.0, 45.0, ("weights",))
    writer.phase_stack(["step"])      # the detail of a phase no longer innermost is no channel
    assert read_state(path).channel is None
    writer.phase_detail("", 0.0, "")
    assert read_state(path).phase_detail is None


def test_previous_version_is_still_read_without_the_new_regions(tmp_path):
    # GIVEN a file written by version 3 (same size and layout; the new regions were unused)
    path = tmp_path / "agent-4.state"
    writer = StateWriter(str(path), pid=4, rank=2, local_rank=0, world_size=4, now=10.0)
    writer.phase_stack(["step", "rollout"])
    writer.phase_detail("rollout", 11.0, "infer\tserver\th:1")   # bytes a v3 agent never wrote
    writer.engine(0, 7, 1, 0, statefile.ENGINE_ASLEEP, 1, 0, 12.0, 0.0)
    writer.close()
    data = bytearray(path.read_bytes())
    data[4:6] = (3).to_bytes(2, "little")
    # THEN it reads, with no detail and no engines
    state = parse_state(bytes(data))
    assert (state.rank, state.phase_stack) == (2, ("step", "rollout"))
    assert state.phase_detail is None and state.engines == ()
