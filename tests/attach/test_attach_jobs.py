"""``stalldoc attach`` on real torchrun (gloo) jobs started without stalldoc: the culprit rank and
its frame, by the launcher's pid and by a rank's; a working job is not called stalled; --log;
--follow through a later hang and a rank's death; and the job is never harmed: the same pids
alive, not stopped, no signal caught, its heartbeat going on."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from load import cpu_burner
from support import (ATTACH_WINDOW, JOB_PRELUDE, RunningJob, attach, running_job,
                     wait_for_line)

pytest.importorskip("torch")

LOADER_JOB = """\
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist


def load_shard(path):
    with open(path) as shard:
        return shard.read()


def sync_weights_store(rank):
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=1))
    try:
        store.wait([f"/broadcast_from/{rank}/1"], timedelta(seconds=1))
    except Exception:
        traceback.print_exc()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        sync_weights_store(rank)
    ready(rank)
    if rank == 1:
        fifo = OUT / "shard-00001.fifo"
        os.mkfifo(fifo)
        load_shard(fifo)
    dist.all_reduce(torch.ones(1))


main()
"""

BUSY_JOB = """\
import torch.distributed as dist


def compute_features(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ready(rank)
    if rank == dist.get_world_size() - 1:
        while True:
            compute_features(2_000_000)
    dist.barrier()


main()
"""

STEPS_JOB = """\
import torch
import torch.distributed as dist


def compute_features(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def read_batch(path):
    with open(path) as batch:
        return batch.read()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ready(rank)
    step = 0
    while True:
        compute_features(300_000)
        if rank == 0 and (OUT / "batch.fifo").exists():
            if read_batch(OUT / "batch.fifo") != "ok":
                raise RuntimeError("batch 7 is corrupt")
        dist.all_reduce(torch.ones(1))
        step += 1
        print(f"step {step}", flush=True)


main()
"""


def line_of(body: str, text: str) -> int:
    """The line of ``text`` in the job script (JOB_PRELUDE + body)."""
    lines = (JOB_PRELUDE + body).splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def report(run_dir: Path, fmt: str) -> str:
    out = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(run_dir), "--format",
                          fmt], capture_output=True, text=True, check=True)
    return out.stdout


def assert_unharmed(job: RunningJob, beats_before: dict[int, int]) -> None:
    """Every rank alive under its pid, not stopped, no signal caught, its heartbeat on."""
    states = job.states()
    assert all(state and state not in "TtZX" for state in states.values()), states
    assert job.signals() == []
    deadline = time.time() + 10
    while time.time() < deadline and not all(
            job.beats()[r] > beats_before[r] for r in job.ranks):
        time.sleep(0.2)
    assert all(job.beats()[r] > beats_before[r] for r in job.ranks), (beats_before, job.beats())


@pytest.fixture(scope="module")
def loader_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningJob]:
    """3 ranks: rank 1 blocked in load_shard (a FIFO no one writes), ranks 0 and 2 in
    all_reduce; rank 0 logged a real c10d store timeout before."""
    with running_job(tmp_path_factory.mktemp("loader"), LOADER_JOB, 3,
                     name="pretrain_llm.py") as job:
        yield job


def culprit_frame() -> str:
    """load_shard (/tmp/.../pretrain_llm.py:N), as a regular expression."""
    line = line_of(LOADER_JOB, "with open(path) as shard")
    return rf"load_shard \(/\S+/pretrain_llm\.py:{line}\)"


def test_attach_by_launcher_names_the_rank_outside_the_collective(
        loader_job: RunningJob, tmp_path: Path) -> None:
    beats = loader_job.beats()
    result = attach(tmp_path / "run", str(loader_job.launcher.pid))
    assert result.code == 0, result.stderr
    out = result.stdout
    assert f"attached to pid {loader_job.launcher.pid} (torchrun)" in out
    assert "[SD101 error] rank 1 not in the collective that ranks 0,2 wait in" in out
    assert re.search(culprit_frame(), out)
    verdict = next(line for line in out.splitlines() if line.startswith("stalled:"))
    assert f"showed work in {ATTACH_WINDOW} s" in verdict and "SD101" in verdict
    assert_unharmed(loader_job, beats)

    text = report(result.run_dir, "text")
    assert re.search(culprit_frame(), text)
    assert f"attached: to pid {loader_job.launcher.pid}" in text
    assert "attach detached; the job ran on" in text
    document = json.loads(report(result.run_dir, "json"))
    sd101 = next(f for f in document["findings"] if f["code"] == "SD101")
    assert sd101["ranks"] == [1] and re.fullmatch(culprit_frame(), sd101["evidence"]["frame"])
    assert document["run"]["attached"]["pids"] == [loader_job.launcher.pid]
    assert document["run"]["attached"]["job_ended"] is False
    assert {r["pid"] for r in document["ranks"]} == set(loader_job.ranks.values())
    assert len(document["stalls"]) == 1 and not document["run"]["agent"]


def test_attach_by_a_rank_pid_finds_the_whole_job_and_reads_its_log(
        loader_job: RunningJob, tmp_path: Path) -> None:
    """By rank 2's pid; the job's log holds a real DistStoreError (a c10d store wait that timed
    out on rank 0): SD514 beside the stall's diagnosis."""
    assert "DistStoreError: wait timeout" in loader_job.log.read_text()
    beats = loader_job.beats()
    result = attach(tmp_path / "run", "--log", str(loader_job.log), str(loader_job.ranks[2]))
    assert result.code == 0, result.stderr
    assert f"attached to pid {loader_job.launcher.pid} (torchrun)" in result.stdout
    assert "3 rank(s)" in result.stdout
    assert "rank 1 not in the collective that ranks 0,2 wait in" in result.stdout
    assert re.search(culprit_frame(), result.stdout)
    assert "[SD514" in result.stdout and "broadcast_from" in result.stdout
    assert_unharmed(loader_job, beats)
    document = json.loads(report(result.run_dir, "json"))
    assert {"SD101", "SD514"} <= {f["code"] for f in document["findings"]}
    assert document["run"]["attached"]["pids"] == [loader_job.ranks[2]]


def test_a_rank_py_spy_cannot_read_is_never_signalled(loader_job: RunningJob,
                                                     tmp_path: Path) -> None:
    """py-spy denied (ptrace refused): without an agent, no faulthandler fallback (a signal)."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    fake.chmod(0o755)
    code = ("import sys, stalldoc.probes.pyspy as p; fake = sys.argv.pop(1); "
            "p.pyspy_binary = lambda: fake; from stalldoc.cli import main; "
            "main(prog_name='stalldoc')")
    beats = loader_job.beats()
    result = attach(tmp_path / "run", str(loader_job.launcher.pid),
                    python=[sys.executable, "-c", code, str(fake)])
    assert result.code == 0, result.stderr
    assert "stacks of ranks 0-2 from the fallback: py-spy was denied" in result.stdout
    assert "stalled:" in result.stdout
    assert_unharmed(loader_job, beats)
    stacks = json.loads(report(result.run_dir, "json"))["stacks"]
    assert {s["method"] for s in stacks} == {"none"}


def test_attach_refuses_a_run_dir_in_use(loader_job: RunningJob, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "other").write_text("")
    result = attach(tmp_path / "run", str(loader_job.launcher.pid))
    assert result.code == 125 and result.stderr.strip().count("\n") == 0
    assert "run directory is not empty" in result.stderr


@pytest.mark.alone
def test_a_working_job_is_not_called_stalled(tmp_path: Path) -> None:
    """Ranks 0-1 wait in a barrier while rank 2 computes: working, on an idle node and on one
    whose cores are all taken by other processes."""
    with running_job(tmp_path, BUSY_JOB, 3, name="featurize.py") as job:
        for load in (0, 2):
            beats = job.beats()
            with cpu_burner(load):
                result = attach(tmp_path / f"run-{load}", str(job.ranks[0]))
            assert result.code == 0, result.stderr
            assert "STALL" not in result.stdout and "stalled:" not in result.stdout
            verdict = next(line for line in result.stdout.splitlines()
                           if line.startswith("working:"))
            # rank 2's work: CPU it used, or (cores taken by more than this burner, as beside
            # the suite's other workers) the CPU it was runnable and waited for
            assert re.search(r"rank 2 (CPU busy|runnable, waiting for a CPU \d+% \(ran \d+%\)) "
                             r"in compute_features \(/\S+/featurize\.py:\d+\)", verdict), verdict
            assert_unharmed(job, beats)
            document = json.loads(report(result.run_dir, "json"))
            assert document["stalls"] == [] and document["run"]["attached"]["job_ended"] is False


def test_follow_diagnoses_a_later_hang_and_a_dead_rank_and_ends_with_the_job(
        tmp_path: Path) -> None:
    with running_job(tmp_path, STEPS_JOB, 2, name="sft_loop.py") as job:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stalldoc", "attach", "--run-dir", str(tmp_path / "run"),
             "--window", ATTACH_WINDOW, "--follow", "--stall-timeout", "2", "--log",
             str(job.log), str(job.launcher.pid)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        seen: list[str] = []
        try:
            assert proc.stdout is not None
            wait_for_line(proc.stdout, "following pid", seen)
            assert any(line.startswith("working:") for line in seen), seen
            os.mkfifo(job.out / "batch.fifo")
            wait_for_line(proc.stdout, "diagnosis:", seen)
            wait_for_line(proc.stdout, "[SD101 error] rank 0 not in the collective", seen)
            wait_for_line(proc.stdout, "sft_loop.py:", seen)
            assert "read_batch (/" in seen[-1]
            assert job.signals() == [] and all(s not in "TtZX" for s in job.states().values())
            with open(job.out / "batch.fifo", "w") as fifo:
                fifo.write("bad")
            rest, errors = proc.communicate(timeout=90)
        finally:
            proc.kill()
        out = "".join(seen) + rest
        assert proc.returncode == 0, errors
        assert "[SD103 critical] rank 0 (pid" in out and "exited with status 1" in out
        assert f"the ranks of pid {job.launcher.pid} (torchrun) ended" in out
    document = json.loads(report(tmp_path / "run", "json"))
    codes = {f["code"] for f in document["findings"]}
    assert {"SD101", "SD103"} <= codes
    assert document["run"]["attached"]["job_ended"] is True
    assert document["run"]["attached"]["follow"] is True
