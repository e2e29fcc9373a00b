"""Stall start → finding latency with real torchrun jobs (target <= stall timeout + 5 s).

The stall starts when the culprit rank last made progress (the report's stall.started_at); the
latency is the time of the first finding after it. The stall timeout is the baseline.

    python benchmarks/detection_latency.py [RUNS] [STALL_TIMEOUT]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import torchrun  # noqa: E402


def one(timeout: float, ranks: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(run_dir),
                        "--stall-timeout", str(timeout), "--on-stall", "kill", "--kill-grace", "2",
                        "--", *torchrun(ranks, "collective_wait.py")],
                       env={**os.environ, "OMP_NUM_THREADS": "1", "STUCK_RANK": "1"},
                       capture_output=True, timeout=300)
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "stalldoc", "report", str(run_dir), "--format", "json"],
            capture_output=True, text=True, check=True).stdout)
        stall = report["stalls"][0]
        return stall["detected_at"] - stall["started_at"], report["findings"][0]["t"] - stall["started_at"]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    for ranks in (2, 4):
        for _ in range(runs):
            detected, finding = one(timeout, ranks)
            print(f"{ranks} ranks, stall timeout {timeout:.0f} s: stall detected after "
                  f"{detected:.2f} s, finding after {finding:.2f} s "
                  f"(ratio {finding / timeout:.2f} x timeout; target <= timeout + 5 s)")


if __name__ == "__main__":
    main()
