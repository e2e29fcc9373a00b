"""``stalldoc attach`` on jobs whose ranks have no RANK in their environment, started without
stalldoc: srun- and mpirun-style tasks (each knows its rank from its launcher's variable) are
named by rank; Lightning's own launcher (the process the user started is local rank 0 and starts
the others with LOCAL_RANK, NODE_RANK and WORLD_SIZE) is named by its tree, on one node and on
the second node of two; PyTorch's mp.spawn tutorial, whose ranks learn their number inside the
process, is refused in one line that says why, never guessed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from support import SCENARIOS, attach, free_port

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[callable]:
    """Start a job without stalldoc, in a session of its own, until ``ready`` is in its log;
    its whole session is killed when the test ends."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str], ready: str) -> tuple[int, Path]:
        log = tmp_path / f"job{len(procs)}.log"
        with open(log, "wb") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "OMP_NUM_THREADS": "1", **env})
        procs.append(proc)
        deadline = time.time() + 120
        while ready not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)   # the stuck rank reached its function, the others their all-reduce
        return proc.pid, log

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.parametrize("kind,tasks,stuck,by", [("slurm", 3, 2, "launcher"),
                                                 ("openmpi", 2, 0, "task"),
                                                 ("pmi", 3, 1, "task")])
def test_tasks_of_srun_and_mpirun_are_named_by_their_rank(
        tmp_path: Path, started: callable, kind: str, tasks: int, stuck: int, by: str) -> None:
    # GIVEN srun- / mpirun-style tasks mapping their launcher's variables to RANK themselves
    # (after start: /proc shows only the launcher's), one stuck before its all-reduce
    argv = [sys.executable, str(SCENARIOS / "task_launcher.py"), kind, str(tasks),
            str(SCENARIOS / "mapped_ranks.py")]
    env = {"MASTER_PORT": str(free_port()), "STUCK_RANK": str(stuck), "STEPS": "40",
           "STUCK_FUNC": "read_batch"}
    other = (stuck + 1) % tasks
    launcher, _ = started(argv, env, f"rank {other} step 1")
    task = next(c for c in _children(launcher))
    # WHEN attach is given the launcher's pid, or one task's
    result = attach(tmp_path / "run", str(launcher if by == "launcher" else task))
    # THEN every task is its rank, by its launcher's variable, and the stuck one is named
    assert result.code == 0, result.stderr
    assert f"{tasks} rank(s)" in result.stdout, result.stdout
    document = result.report()
    ranks = {r["rank"]: r for r in document["ranks"]}
    assert sorted(ranks) == list(range(tasks)), document["ranks"]
    assert {r["pid"] for r in ranks.values()} == set(_children(launcher))
    sd101 = next(f for f in document["findings"] if f["code"] == "SD101")
    assert sd101["ranks"] == [stuck], sd101["summary"]
    assert sd101["evidence"]["frame"].startswith("read_batch ("), sd101["evidence"]


def _attach_names(tmp_path: Path, pid: int, ranks: list[int], stuck: int, func: str) -> None:
    """attach on ``pid`` finds exactly ``ranks`` (from Lightning's tree) and names ``stuck``."""
    result = attach(tmp_path / "run", str(pid))
    assert result.code == 0, result.stderr
    document = result.report()
    found = {r["rank"]: r for r in document["ranks"]}
    assert sorted(found) == ranks, document["ranks"]
    assert {r["source"] for r in found.values()} == {"Lightning"}, document["ranks"]
    assert found[ranks[0]]["pid"] == pid    # the process the user started: local rank 0
    assert {r["pid"] for r in found.values()} - {pid} == set(_children_with("LOCAL_RANK", pid))
    # DDP's gradient all-reduce waits inside backward(), in C++: without the agent, py-spy's
    # stacks do not show it as a collective, so the stall's finding is SD106 naming the rank
    # whose frame is its own code, not SD101
    [finding] = [f for f in document["findings"] if f["code"] in ("SD101", "SD106")]
    assert finding["ranks"] == [stuck], finding["summary"]
    assert finding["evidence"]["frame"].startswith(f"{func} ("), finding["evidence"]


def test_lightning_ranks_are_named_from_its_launchers_tree(tmp_path: Path,
                                                           started: callable) -> None:
    pytest.importorskip("lightning")
    # GIVEN Trainer(devices=3, strategy="ddp") started as `python train.py` (Lightning starts
    # local ranks 1 and 2 itself), global rank 1 stuck inside training_step
    env = {"DEVICES": "3", "STEPS": "40", "STUCK_RANK": "1", "STUCK_FUNC": "decode_images"}
    main, _ = started([sys.executable, str(SCENARIOS / "lightning_ddp.py")], env,
                      "rank 2 step 2")
    # WHEN attach is given the pid the user started; THEN ranks 0-2, rank 1 named
    _attach_names(tmp_path, main, [0, 1, 2], 1, "decode_images")


def test_lightning_second_node_ranks_are_its_global_ranks(tmp_path: Path,
                                                          started: callable) -> None:
    pytest.importorskip("lightning")
    # GIVEN a 2-node Lightning job (num_nodes=2, devices=2; NODE_RANK per node, as Lightning's
    # docs start one without a scheduler), both "nodes" here, global rank 3 stuck
    env = {"DEVICES": "2", "NUM_NODES": "2", "STEPS": "40", "STUCK_RANK": "3",
           "STUCK_FUNC": "fetch_prompts", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    started([sys.executable, str(SCENARIOS / "lightning_ddp.py")], {**env, "NODE_RANK": "0"},
            "Initializing distributed")   # it waits for the other node to join
    second, _ = started([sys.executable, str(SCENARIOS / "lightning_ddp.py")],
                        {**env, "NODE_RANK": "1"}, "rank 2 step 2")
    # WHEN attach is given node 1's command; THEN its ranks are 2 and 3 (1 * 2 + local rank)
    _attach_names(tmp_path, second, [2, 3], 3, "fetch_prompts")


def test_mp_spawn_ranks_are_not_guessed(tmp_path: Path, started: callable) -> None:
    # GIVEN PyTorch's DDP tutorial (mp.spawn; each process passes its rank to
    # init_process_group), rank 1 stuck
    env = {"WORLD": "3", "PORT": str(free_port()), "STUCK_RANK": "1", "STEPS": "40"}
    parent, _ = started([sys.executable, str(SCENARIOS / "spawn_ddp.py")], env, "rank 0 step 1")
    # WHEN attach is given the spawn parent's pid
    result = attach(tmp_path / "run", str(parent))
    # THEN it says in one line that it cannot tell which process is which rank, and why
    assert result.code == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    # (the parent, its 3 ranks and multiprocessing's resource tracker, if started)
    count = re.search(r"(\d+) Python processes, none with RANK", result.stderr)
    assert count and int(count.group(1)) >= 4, result.stderr
    assert "does not guess" in result.stderr and "stalldoc watch" in result.stderr
    assert not (tmp_path / "run").exists()


def _children(pid: int) -> list[int]:
    import psutil
    return [c.pid for c in psutil.Process(pid).children()]


def _children_with(variable: str, pid: int) -> list[int]:
    import psutil
    return [c.pid for c in psutil.Process(pid).children() if variable in c.environ()]
