"""Two real gloo ranks issue thousands of small all_reduces per second under the agent while the
agent probe reads their rings tick after tick: every collective is accounted for, either read
or counted as overwritten before it could be read (``GroupState.wrapped``)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalldoc.agent.statefile import RING_SLOTS
from stalldoc.run.inject import agent_environment
from stalldoc.model.collectives import GroupState
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.agent_state import AgentStateProbe

CALLS = 6000
RANK = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()                       # collective 1: the watcher reads it before the others
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    t = torch.ones(4)
    for _ in range(%d):
        dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
""" % CALLS)


def _start(run_dir: Path, port: int, go: Path) -> list[subprocess.Popen[bytes]]:
    procs = []
    for rank in range(2):
        env = agent_environment(run_dir, dict(os.environ), os.getpid())
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(go)], env=env))
    return procs


def _watch(probe: AgentStateProbe, ranks: list[RankProcess],
           procs: list[subprocess.Popen[bytes]], go: Path) -> dict[int, list[GroupState]]:
    """Each rank's world group at every read, reading every second (the watcher's tick) until
    both ranks ended (and once after); the ranks start their all_reduces once the probe has
    read both rings."""
    reads: dict[int, list[GroupState]] = {0: [], 1: []}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        done = all(p.poll() is not None for p in procs)
        for rank, agent in probe.read(ranks).states.items():
            reads[rank] += [g for g in agent.groups if g.name == "world"]
        if all(reads.values()):
            go.touch()
        if done:
            return reads
        time.sleep(1.0)
    raise AssertionError("the ranks did not finish")


@pytest.mark.timeout(300)
def test_every_collective_is_read_or_counted_as_wrapped(tmp_path):
    from support import free_port
    go = tmp_path / "go"
    procs = _start(tmp_path, free_port(), go)
    try:
        ranks = [RankProcess(r, p.pid, r, ("python",)) for r, p in enumerate(procs)]
        reads = _watch(AgentStateProbe(str(tmp_path / "agents")), ranks, procs, go)
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
            proc.wait()
    assert [p.returncode for p in procs] == [0, 0]
    for rank, groups in reads.items():
        last = groups[-1]
        assert last.started == last.completed == CALLS + 2          # and the two barriers
        assert groups[0].started == 1          # read from its first collective on
        seen = {rec.seq for g in groups for rec in g.ring}
        assert seen <= set(range(1, last.started + 1))
        assert len(seen) + last.wrapped == last.started, rank
        assert last.ring[-1].seq == last.started and len(last.ring) == RING_SLOTS
        assert last.wrapped > 0, "the ring never wrapped between two reads: the test saw nothing"
        assert [g.wrapped for g in groups] == sorted(g.wrapped for g in groups)
