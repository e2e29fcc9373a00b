"""A rank that crashes in its teardown after the training completed, under real watch: said as
what it is (SD115, warning, the upstream exit race), never as a failed training (SD103), and the
job's exit status left as the launcher gave it. Real torchrun, gloo, DDP; the crash is real
(tests/scenarios/teardown_abort.py: a daemon thread inside torch's C++ as Python finalizes).
And what a destroyed process group leaves running into interpreter exit, where the race lies:
the torch fact SD115's fix rests on, and that under watch no more is left than without."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from support import alarms, torchrun

ABORT = "terminate called without an active exception"


def test_without_stalldoc_the_scenario_really_crashes_at_exit():
    out = subprocess.run(torchrun(2, "teardown_abort.py"), capture_output=True, text=True,
                         timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 1 and ABORT in out.stderr, out.stderr[-2000:]
    assert "rank 0 done" in out.stdout and "rank 1 done" in out.stdout


def test_a_crash_after_the_work_is_a_teardown_crash_not_a_dead_rank(run_watch):
    result = run_watch(torchrun(2, "teardown_abort.py"), env={"ABORT_RANK": "1"}, timeout=180)
    assert result.code == 1, result.stderr            # torchrun's own answer, unchanged
    assert ABORT in result.stderr
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
    report = result.report()
    assert report["stalls"] == []
    assert [f for f in report["findings"] if f["code"] == "SD103"] == []
    [crash] = result.findings("SD115")
    assert (crash["ranks"], crash["severity"], crash["trigger"]) == ([1], "warning", "exit")
    assert crash["summary"].startswith("rank 1 killed by SIGABRT at interpreter exit, after the "
                                       "work was done"), crash["summary"]
    assert "pytorch/pytorch issue 190489" in crash["summary"]
    # torchrun ends rank 0 when rank 1 dies; when that lands while rank 0 is still running,
    # rank 0 is named as ended after it, never as a dead rank
    assert [int(r) for r in crash["evidence"]["ended_after_detail"]] in ([], [0])
    evidence = crash["evidence"]["ranks"]["1"]
    assert evidence["signal"] == 6 and evidence["phase_stack"] == []
    assert evidence["c10d_issued"] >= 4   # DDP's gradient all-reduces and the barrier
    assert result.meta()["watch_exit_code"] == "1"


def test_an_abort_in_the_middle_of_training_is_still_a_dead_rank(run_watch):
    result = run_watch(torchrun(2, "rank_signal.py"), env={"SIGNAL": "ABRT", "SIGNAL_RANK": "1"})
    assert result.code != 0
    [dead] = result.findings("SD103")
    assert (dead["ranks"], dead["severity"]) == ([1], "critical")
    assert "SIGABRT" in dead["summary"]
    assert result.findings("SD115") == []


@pytest.mark.parametrize("ranks,slow", [(2, 0), (3, 1)])
def test_a_rank_slow_to_end_after_the_others_is_no_stall(run_watch, ranks: int, slow: int):
    # GIVEN a finished job whose ranks left their world, one of them taking 8 s to end (its
    # main thread gone, its last thread still at work: the kernel state of a large process
    # being torn down) after the others exited, far past the 3 s stall timeout, with the kill
    # action armed
    result = run_watch(torchrun(ranks, "slow_exit.py"), "--on-stall", "kill",
                       env={"SLOW_RANK": str(slow), "EXIT_SECONDS": "8"}, timeout=180)
    # THEN the job ends as it would have: no stall, no false alarm, every exit 0, the slow
    # rank's recorded last, when its last thread went
    assert result.code == 0, result.stderr[-3000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-3000:]
    exits = {r["rank"]: r for r in report["ranks"]}
    assert sorted(exits) == list(range(ranks)) and {r["exit_code"] for r in exits.values()} == {0}
    assert exits[slow]["ended_at"] > max(r["ended_at"] for n, r in exits.items() if n != slow)


def gloo_threads_left(lines: str) -> list[str]:
    """Each rank's "rank N gloo threads: ..." line, also where two ranks' lines ran into each
    other (unbuffered output: a line and its newline are two writes, another rank's between)."""
    found = re.findall(r"rank \d+ gloo threads: (?:none|[a-z_]+?(?:,[a-z_]+?)*)"
                       r"(?=rank \d+ gloo threads:|\s|$)", lines)
    return sorted(found)


NONE_LEFT = ["rank 0 gloo threads: none", "rank 1 gloo threads: none"]


def _threads_left(**env: str) -> list[str]:
    out = subprocess.run(torchrun(2, "ddp_group_threads.py"), capture_output=True, text=True,
                         timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return gloo_threads_left(out.stdout)


@pytest.mark.parametrize("model", ["ddp", "all_reduce"])
def test_torch_dynamo_imported_after_init_keeps_the_gloo_threads_as_sd115s_fix_says(model):
    # SD115's fix rests on this torch fact: torch._dynamo imported once a group exists (by
    # optimizer.step(), by DDP) keeps the group, and its gloo threads, past the script freeing
    # everything and destroy_process_group(); imported before init_process_group it does not
    left = _threads_left(MODEL=model)
    assert len(left) == 2 and all("pt_gloo_runloop" in line for line in left), left
    assert _threads_left(MODEL=model, DYNAMO_FIRST="1") == NONE_LEFT


@pytest.mark.parametrize("model", ["ddp", "all_reduce", "dp_group"])
def test_under_watch_a_destroyed_group_ends_its_threads_as_without(run_watch, model):
    # the agent's collective wrapper records every all_reduce on its group (a data-parallel
    # group passed as group=, or the default): it must not keep that group alive, or its gloo
    # threads would live on into interpreter exit, exposed to torch's exit race, under watch only
    result = run_watch(torchrun(2, "ddp_group_threads.py"), env={"MODEL": model,
                                                                 "DYNAMO_FIRST": "1"},
                       timeout=180)
    assert result.code == 0, result.stderr
    assert gloo_threads_left(result.stdout) == NONE_LEFT, result.stdout
