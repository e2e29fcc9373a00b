"""A job that floods its output, then hangs: vLLM logs every weight it reloads, a loop prints
one warning per iteration. The watcher reads the flood for a bounded time a tick, lets the
oldest waiting lines go, and keeps the newest: the last words before the hang reach the run."""
from __future__ import annotations

import sys

from support import run_meta, watch
from stalldoc.store.reader import open_reader

JOB = r"""
import sys, time
out = sys.stdout
for n in range(150_000):
    out.write(f"INFO 11-29 19:00:0{n % 10} [gpu_model_runner.py:2314] reloaded "
              f"model.layers.{n % 28}.mlp.gate_up_proj.weight ({n} of 150000)\n")
out.write("rank 0: waiting for the reward server at 10.0.0.7:8000 (attempt 1)\n")
out.flush()
time.sleep(3600)
"""


def test_the_last_line_before_a_hang_survives_a_flood(tmp_path):
    # (what is kept does not hang on timing: the flood outruns the watcher on any machine)
    done = watch(tmp_path, [sys.executable, "-c", JOB], "--on-stall", "kill", timeout=240)
    assert done.code == 124, done.stderr[-3000:]
    with open_reader(done.run_dir) as conn:
        last = conn.execute("SELECT line FROM logs ORDER BY rowid DESC LIMIT 1").fetchone()[0]
        kept = conn.execute("SELECT count(*) FROM logs").fetchone()[0]
    assert last == "rank 0: waiting for the reward server at 10.0.0.7:8000 (attempt 1)"
    dropped = int(run_meta(done.run_dir)["dropped_log_lines"])
    assert dropped > 0 and kept + dropped >= 150_001, (kept, dropped)
