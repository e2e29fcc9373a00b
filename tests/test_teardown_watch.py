"""A rank that crashes in its teardown after the training completed, under real watch: said as
what it is (SD115, warning, the upstream exit race), never as a failed training (SD103), and the
job's exit status left as the launcher gave it. Real torchrun, gloo, DDP; the crash is real
(tests/scenarios/teardown_abort.py: a daemon thread inside torch's C++ as Python finalizes)."""
from __future__ import annotations

import os
import subprocess

from support import torchrun

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


def test_freeing_a_ddp_model_does_not_end_its_gloo_threads_as_sd115s_fix_says():
    # SD115's fix tells users to leave with os._exit(0), not to free the model: on this torch a
    # DDP model keeps its process group, and the group's gloo threads, past its own end and
    # destroy_process_group(). The control (a plain all_reduce) shows the threads can end.
    lines = {}
    for model in ("ddp", "none"):
        out = subprocess.run(torchrun(2, "ddp_group_threads.py"), capture_output=True, text=True,
                             timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1",
                                               "MODEL": model})
        assert out.returncode == 0, out.stderr[-2000:]
        lines[model] = sorted(line for line in out.stdout.splitlines() if "gloo threads" in line)
    assert lines["none"] == ["rank 0 gloo threads: none", "rank 1 gloo threads: none"]
    for line in lines["ddp"]:
        assert "pt_gloo_runloop" in line, lines
    assert len(lines["ddp"]) == 2, lines
