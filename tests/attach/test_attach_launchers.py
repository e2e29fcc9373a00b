"""``stalldoc attach`` on jobs whose ranks have no RANK in their environment, started without
stalldoc: srun- and mpirun-style tasks (each knows its rank from its launcher's variable) are
named by rank; PyTorch's mp.spawn tutorial, whose ranks learn their number inside the process,
is refused in one line that says why, never guessed."""
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
