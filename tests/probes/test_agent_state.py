"""A state file that is not an agent's (out-of-range numbers, garbage, a FIFO, a directory, a link,
a name that is no pid) is skipped and counted by the agent probe; it never stops nor blocks it."""
from __future__ import annotations

import os
import struct
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from stalldoc.agent import statefile
from stalldoc.agent.statefile import StateWriter, state_path
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.agent_state import AgentStateProbe, StartupCosts
from stalldoc.sidecar.sampling import Sampler
from stalldoc.store.db import RunStore

PID = 4242
RANK = RankProcess(0, PID, 0, ("python",))


def _writer(directory: Path, pid: int = PID) -> StateWriter:
    writer = StateWriter(state_path(str(directory), pid), pid, 0, 0, 1, time.time())
    writer.group_ring(0, "world").enter(b"all_reduce", 4, b"float32", 0, time.time())
    return writer


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def _entry_seq(path: str, seq: int) -> None:
    _patch(path, statefile.entry_offset(0, 1), struct.pack("<Q", seq))


def _append(path: str, size: int) -> None:
    with open(path, "ab") as fh:
        fh.write(b"\0" * size)


def _replace(path: str, make: Callable[[str], None]) -> None:
    os.unlink(path)
    make(path)


def _link(path: str) -> None:
    target = path + ".real"
    StateWriter(target, PID, 0, 0, 1, time.time()).close()
    os.symlink(target, path)


BAD: dict[str, Callable[[str], None]] = {
    "marker beyond int64": lambda p: _patch(p, 40, struct.pack("<Q", 2**64 - 1)),
    "collective sequence beyond int64": lambda p: _entry_seq(p, 2**64 - 2),
    "heartbeat not a number": lambda p: _patch(p, 32, struct.pack("<d", float("nan"))),
    "phase ended at infinity": lambda p: _patch(
        p, statefile.PHASE_RING_OFFSET, struct.pack("<Q48sdd", 1, b"load", 1.0, float("inf"))),
    "wrong magic": lambda p: _patch(p, 0, b"XXXX"),
    "newer version": lambda p: _patch(p, 4, struct.pack("<H", 99)),
    "truncated": lambda p: os.truncate(p, statefile.SIZE // 2),
    "huge": lambda p: _append(p, 1 << 20),
    "a directory": lambda p: _replace(p, os.mkdir),
    "a FIFO": lambda p: _replace(p, os.mkfifo),
    "a symbolic link": lambda p: _replace(p, _link),
}


@pytest.mark.timeout(20)   # a FIFO opened for reading blocks until a writer comes: never here
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_state_file_that_is_no_agents_is_skipped_and_counted(tmp_path, kind):
    # GIVEN a rank whose state file is damaged or crafted
    _writer(tmp_path).close()
    BAD[kind](state_path(str(tmp_path), PID))
    probe = AgentStateProbe(str(tmp_path))
    # WHEN the probe reads it: THEN no state for the rank, one skipped
    read = probe.read([RANK])
    assert read.states == {} and read.skipped == 1


def test_text_is_cut_to_its_region_and_foreign_bytes_replaced(tmp_path):
    # GIVEN a phase named in bytes that are not UTF-8, and a phase stack claiming 65535 bytes
    _writer(tmp_path).close()
    path = state_path(str(tmp_path), PID)
    _patch(path, statefile.PHASE_RING_OFFSET, struct.pack("<Q48sdd", 1, b"\xff\xfeload", 1.0, 2.0))
    _patch(path, statefile.PHASE_STACK_OFFSET, struct.pack("<H", 65535) + b"step/" + b"x" * 600)
    # THEN the file is read: the name with replacement characters, the stack within its 512 bytes
    read = AgentStateProbe(str(tmp_path)).read([RANK])
    state = read.states[0]
    assert read.skipped == 0 and state.phases[-1].name == "\ufffd\ufffdload"
    assert state.phase_stack[0] == "step" and len(state.phase_stack[1]) == 505


def test_names_that_are_no_pid_are_skipped_counted_and_never_swept(tmp_path):
    # GIVEN a live agent's file and names like a state file's that name no process
    _writer(tmp_path, os.getpid()).close()
    odd = ["agent--5.state", "agent-99999999999999999999.state", "agent-abc.state",
           "agent-\u0663.state", "agent-0.state"]
    for name in odd:
        (tmp_path / name).write_bytes(b"")
    probe = AgentStateProbe(str(tmp_path))
    # THEN only the pid is listed, the others counted with the tick's read
    assert probe.pids_with_state() == {os.getpid()}
    assert probe.read([]).skipped == len(odd)
    # AND sweeping passes over them (a negative pid stopped the watcher with ValueError)
    assert probe.sweep(set(), StartupCosts()) == 0
    assert all((tmp_path / name).exists() for name in odd)


@pytest.mark.timeout(20)
def test_sweep_removes_a_fifo_of_an_ended_pid_without_waiting(tmp_path):
    proc = subprocess.Popen(["true"])
    proc.wait()
    os.mkfifo(state_path(str(tmp_path), proc.pid))
    assert AgentStateProbe(str(tmp_path)).sweep(set(), StartupCosts()) == 1
    assert not os.path.exists(state_path(str(tmp_path), proc.pid))


def test_counters_at_their_limit_still_fit_the_run_store(tmp_path):
    # GIVEN a rank's agent at the largest counts it may show: markers, and every group's
    # collectives (their sum is stored too)
    agents = tmp_path / "agents"
    agents.mkdir()
    writer = _writer(agents, os.getpid())
    limit = 2**53
    writer.marker(limit, time.time())
    for slot in range(statefile.GROUP_SLOTS):
        writer.group_ring(slot, f"g{slot}")
        _patch(writer.path, statefile.entry_offset(slot, 1),
               struct.pack("<QQdd", limit, 1, 1.0, 2.0))
    writer.close()
    me = [RankProcess(0, os.getpid(), 0, ("python",))]
    tick = Sampler(str(agents), gpus=False).sample(time.time(), me, me, {})
    # THEN they are read, not skipped, and the tick is stored
    assert tick.agents[0].marker_seq == limit
    assert tick.agents[0].collective_seq == statefile.GROUP_SLOTS * limit
    assert {r.probe: r.skipped for r in tick.probes}["agent"] == 0
    store = RunStore(tmp_path)
    store.start_run("r", ["x"], "node", 0.0, 60.0, True)
    store.add_tick(tick)
    store.close()
