"""How often a healthy 2-rank DDP job (gloo) aborts at exit, plain and under ``stalldoc watch``
with each agent feature off in turn, idle and with both cores kept busy, in one run.

torch 2.13 has an exit race of its own: a gloo worker thread that takes the GIL while the
interpreter finalizes (freeing its last work object, whose tensors have Python references) is
ended through a ``noexcept`` frame, and the rank dies with ``terminate called without an active
exception`` (SIGABRT) after its last step (pytorch/pytorch issue 190489, PR 179291). The
group's threads live to finalization because ``torch._dynamo``, imported on first use by DDP and
``optimizer.step()``, keeps the group alive past ``destroy_process_group()`` (see SD115). This
benchmark says whether stalldoc makes the abort more likely:
each arm runs ``tests/scenarios/ddp_steps.py`` with ``EXIT_RACE=keep`` (it ends the ordinary way,
the trigger kept) ``--runs`` times, arms interleaved run by run so drift in the machine's load
falls on all of them alike.

Arms:
- ``plain``: torchrun alone (the baseline);
- ``plain+fr``: torchrun with the Flight Recorder variables watch sets;
- ``watch``: ``stalldoc watch`` with everything on;
- ``watch-c10d``, ``watch-fr``, ``watch-wrap``: watch with the c10d counters, the Flight
  Recorder (``--no-flight-recorder``), the collective wrapper off;
- ``watch-noagent``: ``stalldoc watch --no-agent`` (the sidecar only);
- ``watch-avoid``: watch, the scenario leaving as the test suite's scenarios do
  (``tests/scenarios/exit_race.py``: ``os._exit`` once flushed, the way around SD115 gives);
- not run by default: ``watch-cuda`` and ``watch-hooks`` (the CUDA queries, the library hooks off).
  In a job that never initialised CUDA the CUDA feature is one pure-Python
  ``torch.cuda.is_initialized()`` per beat and never calls into torch's C++, so on a machine
  without a GPU that arm measures the ``watch`` arm again; run it on a GPU node
  (``--arms plain,watch,watch-cuda``). The hooks patch library functions only (no thread).

For each arm: aborted runs / runs, the rate with its 95 % Wilson interval, the ratio to
``plain``'s rate and a one-sided Fisher exact p-value for "the arm aborts more often than plain"
(small p: stalldoc raises the rate). Runs that fail otherwise are counted apart.

    python benchmarks/exit_aborts.py [--runs 30] [--loads idle,busy] [--arms plain,watch,...]
        [--steps 4] [--pause 0.2]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import torchrun  # noqa: E402

ABORT_TEXT = "terminate called without an active exception"
FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}   # with TORCH_FR_DUMP_TEMP_FILE, as watch sets them
ARMS: dict[str, tuple[bool, tuple[str, ...], dict[str, str]]] = {
    # name: (under watch, watch options, environment)
    "plain": (False, (), {}),
    "plain+fr": (False, (), FR_ENV),
    "watch": (True, (), {}),
    "watch-c10d": (True, (), {"STALLDOC_AGENT_OFF": "c10d"}),
    "watch-fr": (True, ("--no-flight-recorder",), {}),
    "watch-wrap": (True, (), {"STALLDOC_AGENT_OFF": "collectives"}),
    "watch-noagent": (True, ("--no-agent",), {}),
    "watch-avoid": (True, (), {"EXIT_RACE": "leave"}),
    "watch-cuda": (True, (), {"STALLDOC_AGENT_OFF": "cuda"}),
    "watch-hooks": (True, (), {"STALLDOC_AGENT_OFF": "hooks"}),
}
DEFAULT_ARMS = ("plain", "plain+fr", "watch", "watch-c10d", "watch-fr", "watch-wrap",
                "watch-noagent", "watch-avoid")


@dataclass
class Tally:
    runs: int = 0
    aborted: int = 0
    other: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _command(arm: str, tmp: Path, run: int) -> tuple[list[str], dict[str, str]]:
    watched, options, extra = ARMS[arm]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EXIT_RACE": "keep", **extra}
    if "TORCH_FR_BUFFER_SIZE" in extra:
        env["TORCH_FR_DUMP_TEMP_FILE"] = str(tmp / f"fr{run}" / "rank_")
    job = torchrun(2, "ddp_steps.py")
    if not watched:
        return job, env
    return [sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(tmp / f"{arm}-{run}"),
            "--stall-timeout", "60", *options, "--", *job], env


def run_once(arm: str, tmp: Path, run: int, steps: int, pause: float) -> tuple[bool, str]:
    """(aborted, other failure or '') of one run of ``arm``."""
    command, env = _command(arm, tmp, run)
    env.update({"STEPS": str(steps), "STEP_PAUSE": str(pause)})
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    aborted = ABORT_TEXT in proc.stderr
    if proc.returncode != 0 and not aborted:
        return False, f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    return aborted, ""


@contextlib.contextmanager
def burner(busy: bool) -> Iterator[None]:
    """Both cores kept busy by plain spinning processes (nice 0) for the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 2)] if busy else []
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p, denom = k / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided Fisher exact p: P(arm's aborts >= k1 | both arms' total aborts), hypergeometric."""
    total, draws = n1 + n0, k1 + k0

    def pmf(x: int) -> float:
        return math.comb(n1, x) * math.comb(n0, draws - x) / math.comb(total, draws)

    return min(1.0, sum(pmf(x) for x in range(k1, min(n1, draws) + 1)))


def measure(arms: list[str], runs: int, busy: bool, steps: int, pause: float) -> dict[str, Tally]:
    tallies = {arm: Tally() for arm in arms}
    with tempfile.TemporaryDirectory() as tmp, burner(busy):
        for run in range(runs):
            for arm in arms:
                began = time.monotonic()
                aborted, other = run_once(arm, Path(tmp), run, steps, pause)
                tally = tallies[arm]
                tally.runs += 1
                tally.aborted += aborted
                tally.seconds += time.monotonic() - began
                if other:
                    tally.other.append(other)
            print(f"  {'busy' if busy else 'idle'} round {run + 1}/{runs}: "
                  + " ".join(f"{a}={t.aborted}" for a, t in tallies.items()), flush=True)
    return tallies


def table(load: str, tallies: dict[str, Tally]) -> None:
    base = tallies.get("plain")
    print(f"\n{load}: arm | aborted/runs | rate [95% CI] | ratio to plain | p(arm > plain) | "
          "other failures | s/run")
    for arm, t in tallies.items():
        low, high = wilson(t.aborted, t.runs)
        rate = t.aborted / t.runs if t.runs else 0.0
        ratio = p_value = "-"
        if base is not None and arm != "plain":
            base_rate = base.aborted / base.runs if base.runs else 0.0
            ratio = f"{rate / base_rate:.2f}" if base_rate else ("inf" if rate else "1.00")
            p_value = f"{fisher_greater(t.aborted, t.runs, base.aborted, base.runs):.3f}"
        print(f"  {arm:14s} | {t.aborted:3d}/{t.runs:<3d} | {rate:5.1%} [{low:.1%}, {high:.1%}]"
              f" | {ratio:>5s} | {p_value:>5s} | {len(t.other)} | {t.seconds / max(t.runs, 1):.1f}")
        for line in t.other[:3]:
            print(f"      {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--loads", default="idle,busy")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.2)
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {','.join(unknown)}; known: {','.join(ARMS)}")
    results = {load: measure(arms, args.runs, load == "busy", args.steps, args.pause)
               for load in args.loads.split(",")}
    for load, tallies in results.items():
        table(load, tallies)


if __name__ == "__main__":
    main()
