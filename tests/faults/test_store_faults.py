"""The run store fails under the watcher (its disk fills up mid-run): the watching and the live
diagnosis go on, said once, and the job is untouched."""
from __future__ import annotations

import pytest

from support import SCENARIOS, watch_on_tmpfs, why_no_tmpfs

FILL_THEN_HANG = r"""
sleep 2
dd if=/dev/zero of="$RUN_FS/filler" bs=64k 2>/dev/null || true
echo disk-full
exec "$PY" "$SCENARIO"
"""


def test_a_full_disk_under_the_run_store_leaves_the_diagnosis_on_the_terminal(tmp_path):
    # GIVEN a run directory on a 3 MB tmpfs that the job fills, then a hang in await_reply
    why = why_no_tmpfs()
    if why:
        pytest.skip(why)
    proc = watch_on_tmpfs(tmp_path, "3m", FILL_THEN_HANG, "--stall-timeout", "3", "--interval",
                          "0.5", "--kill-grace", "3", "--on-stall", "kill",
                          env={"SCENARIO": str(SCENARIOS / "single_wait.py"),
                               "WAIT_FUNC": "await_reply"})
    # THEN the store's failure is said once, the stall is still found and named on the terminal,
    # and --on-stall kill still ends the job after it (exit 124)
    assert "disk-full" in proc.stdout
    assert proc.stderr.count("the run store cannot be written") == 1, proc.stderr
    assert "STALL #1" in proc.stderr and "await_reply" in proc.stderr, proc.stderr
    assert proc.returncode == 124, proc.stderr
