"""SD538 on SGLang's own failure lines: which of the engine's processes, and the OOM killer's
fix for a scheduler killed by SIGKILL (the quoted lines are in ``fixtures/log/SD538.txt``; the
start-up line is SGLang 0.5.23's message, ``entrypoints/engine.py``, as it prints it)."""
from __future__ import annotations

import pytest

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules.sd538_sglang_engine_process_died import SglangEngineProcessDied

STARTUP_KILLED = ("RuntimeError: Rank 1 scheduler died during initialization (exit code: -9). "
                  "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run "
                  "`dmesg -T | grep -i oom` to check.")


def _findings(*texts: str) -> list:
    log = tuple(LogLine(90.0 + n, "stderr", text) for n, text in enumerate(texts))
    return list(SglangEngineProcessDied().check(Window(100.0, (), log=log)))


@pytest.mark.parametrize("line,says", [
    ("[2025-11-03 18:48:34 TP7] Scheduler hit an exception: Traceback (most recent call last):",
     "its scheduler of TP rank 7 raised an exception"),
    ("[2025-03-05 03:55:55] DetokenizerManager hit an exception: Traceback (most recent call "
     "last):", "its DetokenizerManager raised an exception"),
    ("[12-16 14:27:08] Rank 0 scheduler is dead. Please check if there are relevant logs.",
     "its scheduler of TP rank 0 died"),
    (STARTUP_KILLED, "its scheduler of TP rank 1 died (killed by SIGKILL)"),
])
def test_the_summary_names_the_engines_process(line: str, says: str) -> None:
    [finding] = _findings(line)
    assert finding.summary == f"an SGLang engine process died: {says}"
    assert finding.ranks == ()   # SGLang's TP ranks are the engine's, never the job's


def test_a_scheduler_killed_by_sigkill_gets_the_oom_fix() -> None:
    [killed] = _findings(STARTUP_KILLED)
    assert killed.evidence["exit_code"] == -9 and killed.evidence["exit_signal"] == "SIGKILL"
    assert "OOM killer" in killed.fix
    [raised] = _findings("[2025-11-03 18:48:34 TP7] Scheduler hit an exception: Traceback")
    assert "OOM killer" not in raised.fix and "first exception" in raised.fix


def test_the_exception_and_the_sigquit_that_follows_are_one_event() -> None:
    # the scheduler's traceback, then the engine's process hearing its SIGQUIT: one finding,
    # told by the first line
    [finding] = _findings(
        "[2025-08-08 09:09:09 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        "[2025-08-08 09:09:09] Received sigquit from a child process. It usually means the child "
        "failed.")
    assert finding.summary.endswith("its scheduler of TP rank 1 raised an exception")
    assert finding.evidence["count"] == 2
