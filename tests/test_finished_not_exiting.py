"""A job that trains to its end and then does not exit (``scenarios/finished_not_exiting.py``,
torchrun, 2 gloo ranks; rank 0 is the one that logs): held by its metrics uploader thread, not a
daemon, or by an exit handler that syncs checkpoints to a bucket. The stall is declared (nothing
works), and the finding says the script finished and what holds the process, not that a rank
deadlocked on a lock; a run that ends is left alone."""
from __future__ import annotations

from pathlib import Path

import pytest

from load import cpu_burner
from support import SCENARIOS, alarms, torchrun, watch

SCRIPT = SCENARIOS / "finished_not_exiting.py"


@pytest.mark.parametrize("hold,loaded,held_by,says", [
    ("thread", False, "threads", "Python waits for its thread 'metrics-uploader', not a daemon, "
                                 f"at upload_metrics ({SCRIPT}:"),
    ("atexit", True, "exit handler", f"an exit handler blocks at sync_checkpoints_to_bucket "
                                     f"({SCRIPT}:"),
], ids=["non-daemon-thread", "exit-handler-cpu-burner"])
def test_a_rank_that_finished_but_does_not_exit_is_said_so_with_what_holds_it(
        tmp_path: Path, hold: str, loaded: bool, held_by: str, says: str) -> None:
    with cpu_burner(2 if loaded else 0):
        result = watch(tmp_path, torchrun(2, "finished_not_exiting.py"), "--on-stall", "kill",
                       env={"HOLD": hold})
    # THEN both ranks trained to the end; rank 0 is held, the stall ends it (kill armed)
    assert "rank 0: training done" in result.stdout and "rank 1: training done" in result.stdout
    assert result.code == 124, result.stderr[-3000:]
    [finding] = result.findings("SD119")
    assert finding["ranks"] == [0] and finding["severity"] == "warning", finding
    assert finding["summary"].startswith("rank 0 finished its script ") and says in finding[
        "summary"], finding["summary"]
    assert finding["evidence"]["held_by"] == held_by
    # AND nothing calls it a deadlock or a hang of the work
    assert {f["code"] for f in result.report()["findings"]} == {"SD119"}


def test_a_run_whose_ranks_exit_is_no_stall(tmp_path: Path) -> None:
    result = watch(tmp_path, torchrun(2, "finished_not_exiting.py"), "--on-stall", "kill",
                   env={"HOLD": "none"})
    assert result.code == 0, result.stderr[-3000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [] and not result.findings("SD119")
