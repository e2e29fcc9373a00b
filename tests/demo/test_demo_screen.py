"""`stalldoc demo`, README's first command, as a newcomer sees it: one screen (at most 30 lines,
none over 200 characters), the culprit named, no traceback, and the job untouched: rank 1's read
blocks past the stall timeout, the stall is declared and diagnosed, then the read returns and the
job runs to its end (a torchrun job ended by a signal prints torchrun's traceback of it)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def test_the_demo_fits_one_screen_names_the_culprit_and_leaves_the_job_alone(tmp_path: Path):
    # WHEN a newcomer runs the demo (its run stored where they asked)
    done = subprocess.run([sys.executable, "-m", "stalldoc", "demo", "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    screen = (done.stdout + done.stderr).splitlines()
    # THEN it says it found what it shows, on one screen, with no traceback
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(screen) <= 30 and max(map(len, screen)) <= 200, "\n".join(screen)
    assert not any("Traceback" in line or "Error" in line for line in screen), "\n".join(screen)
    # AND the culprit is rank 1, at its line in the data loader, while the others wait
    culprit = [line for line in screen if line.startswith("  [SD101 error] rank 1 ")]
    assert len(culprit) == 1 and re.search(r"rank 1 is in load_shard \(.*hang_job\.py:\d+\)",
                                           culprit[0]), screen
    # AND the job was never touched: the stall ended when the read returned, torchrun and
    # every rank exited 0, and nothing was killed
    assert "[stalldoc] progress resumed after stall #1" in screen
    assert "[stalldoc] job exited 0; report: stalldoc report " in "\n".join(screen)
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "stalldoc", "report", str(tmp_path / "run"), "--format", "json"],
        capture_output=True, text=True, timeout=120, check=True).stdout)
    assert report["run"]["exit_code"] == 0, report["run"]
    assert sorted((r["rank"], r["exit_code"]) for r in report["ranks"]) == [(0, 0), (1, 0),
                                                                           (2, 0)]
    [stall] = report["stalls"]
    assert stall["ended_at"] is not None, stall
