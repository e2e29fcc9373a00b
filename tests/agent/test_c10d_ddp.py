"""Collectives issued from C++ (DDP's reducer) reach the state file through the process groups'
sequence numbers (``agent/c10d_counters.py``), and count as progress: real torch, real gloo."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stalldoc.agent import statefile
from stalldoc.agent.state_reader import StateFileError, parse_state, read_state
from support import run_with_agent, torchrun

pytestmark = pytest.mark.timeout(180) if hasattr(pytest.mark, "timeout") else []

ONE_RANK_GLOO = """
import os, tempfile
import torch, torch.distributed as dist
from torch import nn
store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
"""


def test_the_c10d_slot_reads_back_and_is_zero_when_unwritten(tmp_path):
    path = str(tmp_path / "agent-1.state")
    writer = statefile.StateWriter(path, pid=1, rank=0, local_rank=0, world_size=2, now=1.0)
    assert (read_state(path).c10d_issued, read_state(path).c10d_rose_at) == (0, 0.0)
    writer.identity(10, 1, 2, 0.01, b"python")   # the identity before it is left alone
    writer.c10d(42, 105.5, 2)
    state = read_state(path)
    assert (state.c10d_issued, state.c10d_rose_at, state.identity.comm) == (42, 105.5, "python")
    data = bytearray(Path(path).read_bytes())
    data[statefile.C10D_OFFSET + 8: statefile.C10D_OFFSET + 16] = b"\xff" * 8   # a NaN time
    with pytest.raises(StateFileError, match="c10d rose at"):
        parse_state(bytes(data))


def test_counters_follow_ddp_and_new_groups_and_never_go_back():
    # GIVEN a real gloo group of one rank, a second group, and a DDP model (its all-reduces are
    # issued by the C++ reducer)
    code = ONE_RANK_GLOO + """
import json
from stalldoc.agent.c10d_counters import C10dCounters
counters, seen = C10dCounters(), []
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
counters.read(); seen.append((counters.total, counters.groups))
for _ in range(3):
    model(torch.ones(2, 4)).sum().backward()
    seen.append((counters.read(), counters.total))
other = dist.new_group([0])
dist.all_reduce(torch.ones(1), group=other)
seen.append((counters.read(), counters.total, counters.groups))
mixed = dist.new_group([0], backend="cpu:gloo,cuda:gloo")   # no number of its own
dist.all_reduce(torch.ones(1), group=mixed)
seen.append((counters.read(), counters.total, counters.groups))
dist.destroy_process_group()
seen.append((counters.read(), counters.total, counters.groups))
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    seen = json.loads(out.stdout.splitlines()[-1])
    (start, groups), steps, added, mixed, destroyed = seen[0], seen[1:4], *seen[4:]
    assert groups == 1
    # THEN every backward() moved the total (its bucket's all-reduce; the second step also
    # rebuilds the buckets, with collectives of its own)
    assert [s[0] for s in steps] == [True] * 3
    totals = [start] + [s[1] for s in steps]
    assert totals == sorted(set(totals))
    # AND a new group's collective adds to it, and a destroyed group's stay counted
    assert added == [True, totals[-1] + 1, 2]
    # AND so does a group of several device backends (cpu:gloo,cuda:nccl on a GPU node)
    assert mixed == [True, totals[-1] + 2, 3]
    assert destroyed == [False, totals[-1] + 2, 0]


def test_the_agent_publishes_ddp_collectives_its_rings_never_see(tmp_path):
    code = ONE_RANK_GLOO + """
import os, time
from stalldoc.agent import runtime
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
for _ in range(5):
    model(torch.ones(2, 4)).sum().backward()
runtime.current()._c10d_tick(time.time())   # the beat's own call, not a wait for the beat
print(os.getpid())
"""
    state = run_with_agent(tmp_path, code)
    assert state.c10d_issued >= 5 and state.c10d_rose_at > 0
    assert state.collective_seq == 0   # the Python wrapper saw none of them


def _ddp_run(run_watch, tmp_path: Path, **env: str):
    counts = tmp_path / "counts"
    counts.mkdir()
    result = run_watch(torchrun(2, "ddp_steps.py"), "--on-stall", "kill",
                       env={"COUNTS_DIR": str(counts), **env})
    agents = [read_state(str(p)) for p in sorted((result.run_dir / "agents").glob("*.state"))]
    issued = {int(p.name.split("_")[1]): int(p.read_text()) for p in counts.iterdir()}
    return result, {a.rank: a for a in agents}, issued


def test_a_ddp_loop_idle_between_steps_is_not_a_stall(run_watch, tmp_path):
    # GIVEN a pure DDP loop whose ranks idle 0.5 s before each step, for longer than the stall
    # timeout (3 s) in all: no log line, marker or wrapped collective ever moves, only the
    # reducer's all-reduces (this was a false stall before the c10d counters)
    result, agents, issued = _ddp_run(run_watch, tmp_path, STEPS="12", STEP_PAUSE="0.5")
    # THEN the job ran to its end, unstalled
    assert result.code == 0, result.stderr
    assert "STALL" not in result.stderr and result.report()["stalls"] == []
    # AND each agent saw the reducer's collectives (none came through the Python wrapper)
    for rank in (0, 1):
        assert 0 < agents[rank].c10d_issued <= issued[rank]
        assert agents[rank].collective_seq == 0


def test_one_rank_computing_through_a_long_step_is_not_a_stall(run_watch, tmp_path):
    # GIVEN rank 1 computing on the CPU for 6 s (twice the stall timeout) in one step while
    # rank 0 waits for it in the reducer's all_reduce inside backward()
    result, agents, issued = _ddp_run(run_watch, tmp_path, STEPS="8", SLOW_RANK="1",
                                      SLOW_STEP="3", SLOW_SECONDS="6")
    # THEN no stall: the busy rank works, and the steps around it moved the counters
    assert result.code == 0, result.stderr
    assert result.report()["stalls"] == []
    for rank in (0, 1):
        assert 0 < agents[rank].c10d_issued <= issued[rank]
