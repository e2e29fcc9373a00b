"""A 2-rank DDP loop (a small MLP, gloo) under ``stalldoc watch``: collectives seen per step, and
stalls, with the c10d counters on and off (``STALLDOC_C10D_COUNTERS=0``: the baseline, what the
agent saw before them), in one run. Targets: collectives seen per step > 0, no false stall.

Runs (``tests/scenarios/ddp_steps.py`` and ``ddp_wait.py``, stall timeout 3 s):
- idle: 12 steps, each rank idle 0.5 s before each step (no log lines, markers, phases);
- slow: 8 steps, rank 1 computes on the CPU for 6 s in step 3 while rank 0 waits in all_reduce;
- big: 4 steps of a 151M-parameter MLP (576 MB of gradients, 3-4 buckets; 2-6 s a step here);
- hang: ``ddp_wait.py``, rank 1 never returns from its data loading (a real stall: still found).
Then the agent's cost: one read of every group's sequence number (one heartbeat) with 1 and 8
gloo groups, and what it costs a core at 4 beats a second.

    python benchmarks/ddp_progress.py
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

STALL_TIMEOUT = "3"
RUNS = {
    "idle": ("ddp_steps.py", {"STEPS": "12", "STEP_PAUSE": "0.5"}),
    "slow": ("ddp_steps.py", {"STEPS": "8", "SLOW_RANK": "1", "SLOW_STEP": "3",
                              "SLOW_SECONDS": "6"}),
    "big": ("ddp_steps.py", {"STEPS": "4", "WIDTH": "12288"}),   # 576 MB of gradients a step
    "hang": ("ddp_wait.py", {"STUCK_RANK": "1", "STUCK_STEP": "2"}),
}
READ_COST = """
import os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from stalldoc.agent.c10d_counters import C10dCounters
dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "s"),
                        rank=0, world_size=1)
for groups in (1, 8):
    while len(dist.distributed_c10d._world.pg_map) < groups:
        dist.new_group([0])
    counters, n = C10dCounters(), 20000
    t0 = time.perf_counter()
    for _ in range(n):
        counters.read()
    print(groups, (time.perf_counter() - t0) / n * 1e6)
dist.destroy_process_group()
"""


def run(name: str, counters: bool) -> dict:
    scenario, env = RUNS[name]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, counts = Path(tmp) / "run", Path(tmp) / "counts"
        counts.mkdir()
        proc = subprocess.run(
            [sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(run_dir),
             "--stall-timeout", STALL_TIMEOUT, "--interval", "0.5", "--on-stall", "kill",
             "--kill-grace", "2", "--", *torchrun(2, scenario)],
            env={**os.environ, "OMP_NUM_THREADS": "1", "COUNTS_DIR": str(counts),
                 "STALLDOC_C10D_COUNTERS": "1" if counters else "0", **env},
            capture_output=True, text=True, timeout=300)
        from stalldoc.agent.state_reader import read_state
        agents = [read_state(str(p)) for p in (run_dir / "agents").glob("*.state")]
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "stalldoc", "report", str(run_dir), "--format", "json"],
            capture_output=True, text=True, check=True).stdout)
        stalls = report["stalls"]
        return {"code": proc.returncode, "stalls": len(stalls),
                "detected_after": (stalls[0]["detected_at"] - stalls[0]["started_at"]
                                   if stalls else None),
                "torch": [int(p.read_text()) for p in counts.iterdir()],
                "ring": [a.collective_seq for a in agents],
                "c10d": [a.c10d_issued for a in agents], "steps": int(env.get("STEPS", 0))}


def line(name: str, counters: bool, r: dict) -> str:
    steps = r["steps"]
    per_step = (f"{min(r['c10d']) / steps:.2f}/step (torch counted "
                f"{min(r['torch']) / steps:.2f})" if steps and r["torch"] else "-")
    seen = max(r["ring"]) + max(r["c10d"], default=0)
    detected = f", detected after {r['detected_after']:.1f} s" if r["detected_after"] else ""
    return (f"{name:5} counters {'on ' if counters else 'off'}: exit {r['code']:3}, "
            f"stalls {r['stalls']}{detected}; collectives seen by the agent: ring "
            f"{max(r['ring'])}, c10d {max(r['c10d'], default=0)} ({seen} in all), "
            f"per step {per_step}")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    for name in RUNS:
        results = {on: run(name, on) for on in (False, True)}
        for on in (False, True):
            print(line(name, on, results[on]), flush=True)
        base, now = results[False], results[True]
        if now["steps"]:
            print(f"      baseline -> c10d counters: false stalls {base['stalls']} -> "
                  f"{now['stalls']}; collectives seen per step "
                  f"{max(base['ring']) / now['steps']:.2f} -> "
                  f"{min(now['c10d']) / now['steps']:.2f}")
    out = subprocess.run([sys.executable, "-c", READ_COST, str(ROOT)], capture_output=True,
                         text=True, check=True, timeout=120)
    for row in out.stdout.split("\n"):
        if row.strip():
            groups, us = row.split()
            print(f"agent read of {groups} group(s): {float(us):.2f} us per heartbeat, "
                  f"{float(us) * 4 / 1e4:.5f} % of a core at 4 beats/s; per collective: 0 us "
                  "(nothing on the collective's path)")


if __name__ == "__main__":
    main()
