"""SGLang's schedulers, as its engine starts them, on SGLang's real distributed layer (its
``parallel_state`` and group coordinator over gloo: SGLang has no CPU build, its package installs
beside vLLM's, ``vllm_env``). Each scheduler creates the engine's own world with SGLang's code:
its agent claims an SGLang engine's process, never a rank, and the process that holds the engine
(the user's program, whose children the schedulers are) stays the rank."""
from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

import vllm_env
from support import SCENARIOS, Result, end_watched, start_watch, wait_in_file

pytestmark = pytest.mark.timeout(300)
SCRIPT = str(SCENARIOS / "sglang_schedulers.py")


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def test_a_stopped_scheduler_is_named_as_the_engines_not_a_rank(tmp_path: Path) -> None:
    # GIVEN SGLang's two schedulers (TP 2) of the engine a plain script holds, watched with the
    # kill action armed, running steps
    python, pids_file = vllm_env.python(), tmp_path / "pids.txt"
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        watcher = start_watch(tmp_path / "run", [str(python), SCRIPT, "2", "100000",
                                                 str(pids_file)], "--stall-timeout", "10",
                              "--on-stall", "kill", env=vllm_env.ENGINE_ENV, stdout=out,
                              stderr=err)
    tp1 = None
    try:
        wait_in_file(out_path, r"engine step 5:", watcher, timeout=120)
        tp0, tp1_pid = _pids(pids_file)
        tp1 = psutil.Process(tp1_pid)
        # WHEN the scheduler of TP rank 1 stops (SIGSTOP) in the middle of the steps
        tp1.send_signal(signal.SIGSTOP)
        watcher.wait(timeout=200)
    finally:
        _end(watcher, tp1)
    result = Result(watcher.returncode, err_path.read_text(), tmp_path / "run",
                    out_path.read_text())
    # THEN each scheduler is said to be the engine's, the script is rank 0 (its only rank)
    for tp, pid in ((0, tp0), (1, tp1_pid)):
        assert f"SGLang scheduler (TP rank {tp}) of rank 0's engine: pid {pid}" \
               in result.stderr, result.stderr[-3000:]
    job = int(re.search(r"watching pid (\d+)", result.stderr)[1])
    assert [r["pid"] for r in result.report()["ranks"]] == [job]
    # AND the stall is an error of its own: the rank waits for its SGLang engine, whose
    # stopped scheduler is named, not the fallback
    assert result.code == 124, result.stderr[-4000:]
    [finding] = result.findings("SD122")
    assert finding["ranks"] == [0] and result.findings("SD106") == [], finding
    assert re.fullmatch(
        r"rank 0 waits for its SGLang engine in main \(\S+/sglang_schedulers\.py:\d+\), for "
        rf"\d+ s: SGLang scheduler \(TP rank 1\) of rank 0's engine \(pid {tp1_pid}\) is "
        r"stopped at .+, and the engine runs no step until it is continued",
        finding["summary"]), finding["summary"]
    waits = finding["evidence"]["waits_on_engine"]
    assert [(w["pid"], w["engine"], w["state"]) for w in waits][0] == (tp1_pid, "SGLang",
                                                                        "stopped"), waits
    assert {w["pid"] for w in waits} == {tp0, tp1_pid}, waits


def _end(watcher: subprocess.Popen, stopped: psutil.Process | None) -> None:
    if watcher.poll() is None:
        end_watched(watcher)
    if stopped is not None and stopped.is_running():
        stopped.kill()
