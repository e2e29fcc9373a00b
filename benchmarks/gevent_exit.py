"""Whether ``stalldoc watch`` makes a gevent-monkey-patched job crash: how often
``tests/scenarios/gevent_rewards.py`` (``monkey.patch_all()``, greenlets doing socket round trips
with a server greenlet, a subprocess, then ``sys.exit(3)``) ends otherwise than with its own 3,
plain and under watch, idle and with both cores kept busy.

Issue 44 saw one SIGSEGV (exit 139) in 8 watched runs with both cores busy; this counts enough
runs to tell a real rise from chance. Arms, interleaved run by run so drift in the machine's load
falls on all alike:
- ``plain``: the job alone (the baseline);
- ``watch``: ``stalldoc watch`` with everything on (the agent in the process);
- ``watch-noagent``: ``stalldoc watch --no-agent`` (the sidecar only: py-spy, /proc).

For each arm: runs that did not exit 3 (a run still going after a minute is ended and counted
as hung, status -1) / runs, the rate with its 95 % Wilson interval, and a
one-sided Fisher exact p-value for "the arm fails more often than plain" (small p: stalldoc
raises it); the exit statuses seen. Needs gevent (``pip install gevent``).

    python benchmarks/gevent_exit.py [--runs 30] [--loads idle,busy] [--arms plain,watch,...]
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exit_aborts import burner, fisher_greater, wilson

ROOT = Path(__file__).resolve().parent.parent
JOB = [sys.executable, str(ROOT / "tests" / "scenarios" / "gevent_rewards.py")]
ARMS: dict[str, tuple[str, ...] | None] = {
    "plain": None, "watch": (), "watch-noagent": ("--no-agent",)}
CODE = 3
HANG_SECONDS = 60   # the job takes about a second: a run past this hangs (counted as "hung")
HUNG = -1


def run_once(arm: str, tmp: Path, run: int) -> int:
    """The exit status of one run of ``arm`` (the job's own, through watch)."""
    options = ARMS[arm]
    command = JOB if options is None else [
        sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(tmp / f"{arm}-{run}"),
        "--stall-timeout", "60", *options, "--", *JOB]
    env = {**os.environ, "CODE": str(CODE)}
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          stdin=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            return proc.wait(timeout=HANG_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the job and, under watch, the watcher
            proc.wait()
            return HUNG


def measure(arms: list[str], runs: int, busy: bool) -> dict[str, collections.Counter]:
    codes = {arm: collections.Counter() for arm in arms}
    with tempfile.TemporaryDirectory() as tmp, burner(busy):
        for run in range(runs):
            for arm in arms:
                codes[arm][run_once(arm, Path(tmp), run)] += 1
            print(f"  {'busy' if busy else 'idle'} round {run + 1}/{runs}: " + " ".join(
                f"{a}={sum(n for c, n in k.items() if c != CODE)}" for a, k in codes.items()),
                flush=True)
    return codes


def table(load: str, codes: dict[str, collections.Counter]) -> None:
    def failed(counter: collections.Counter) -> tuple[int, int]:
        return sum(n for c, n in counter.items() if c != CODE), sum(counter.values())

    base = codes.get("plain")
    print(f"\n{load}: arm | failed/runs | rate [95% CI] | p(arm > plain) | exit statuses")
    for arm, counter in codes.items():
        k, n = failed(counter)
        low, high = wilson(k, n)
        p_value = "-"
        if base is not None and arm != "plain":
            p_value = f"{fisher_greater(k, n, *failed(base)):.3f}"
        print(f"  {arm:14s} | {k:3d}/{n:<3d} | {k / max(n, 1):5.1%} [{low:.1%}, {high:.1%}] | "
              f"{p_value:>5s} | {dict(sorted(counter.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--loads", default="idle,busy")
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ARMS]:
        parser.error(f"unknown arm(s) {','.join(unknown)}; known: {','.join(ARMS)}")
    try:
        import gevent  # noqa: F401
    except ImportError:
        sys.exit("gevent_exit.py: gevent is not installed here (pip install gevent)")
    began = time.monotonic()
    results = {load: measure(arms, args.runs, load == "busy")
               for load in args.loads.split(",")}
    for load, codes in results.items():
        table(load, codes)
    print(f"\n{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
