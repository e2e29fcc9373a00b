"""Busy ranks at scale: the watcher's tick, CPU and py-spy samples while every stand-in rank
burns its CPU, as training ranks do (a GPU rank spins in its CUDA syncs), with 8 idle workers
per rank and unrelated processes on the node (``scale.py``'s job, launcher and bystanders).

The ranks run at nice 19, so the 2 cores here play a node where the ranks have cores of their
own and the watcher is not starved by them. Only ``--busy`` ranks spin (12 by default: on 2
cores more would each get less than the 10 % of a core that makes a rank busy); the others
sleep. The watcher is the real one, at its default stall
timeout (45 s: a busy rank's stack is taken again every 11 s). Rows, in one run:

- progressing: every rank's agent counters move before each tick (what the wrapped collectives,
  the c10d counters and the phase markers do on a training rank), sampled as now: a busy rank is
  sampled only when its stack decides its verdict, so never here;
- progressing, before: the same with every busy rank sampled whatever decided its verdict
  (``progress.STACK_DECIDES`` widened to every basis), the baseline;
- no progress: the counters never move (a long compute phase without markers, or a spin): every
  rank's stack decides, and is taken off the tick by the py-spy pool.

Printed: the median and p95 tick, the watcher's CPU with its py-spy children as a share of a core
at one tick a second, py-spy samples taken, and what those samples cost in wall time: the tick
would have waited that long had they been taken inside it, one after another (as before).

    python benchmarks/busy_ranks.py [--ranks 64] [--workers 8] [--ticks 30]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import (INTERVAL, Said, bystanders, cpu_seconds, kill_group,  # noqa: E402
                   make_watcher, start_job, state_files)

from stalldoc.detect import progress  # noqa: E402
from stalldoc.probes import pyspy  # noqa: E402

BUSY_RANK = r'''
import os, sys, time
os.nice(19)
workers = int(sys.argv[1])
for n in range(workers):
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
if int(os.environ["RANK"]) >= int(os.environ["BUSY_RANKS"]):
    time.sleep(3600)
def training_step():
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003
training_step()
'''
EVERY_BASIS = frozenset({"progress", "io", "children", "unclassified", "stack", "spinning",
                         "quiet", "held", "stopped"})


@dataclass(frozen=True)
class Row:
    name: str
    median_ms: float
    p95_ms: float
    cpu_percent: float
    samples: int
    pyspy_ms: float     # the wall time of those samples, one after another


class CountingCapture:
    """Wraps ``dump_pyspy``: how many samples were taken, and their wall time."""

    def __init__(self) -> None:
        self.inner = pyspy.dump_pyspy
        self.count, self.seconds = 0, 0.0

    def __call__(self, *args: object) -> object:
        started = time.perf_counter()
        try:
            return self.inner(*args)  # type: ignore[arg-type]
        finally:
            self.count += 1
            self.seconds += time.perf_counter() - started


def measure(name: str, job: int, ticks: int, progressing: bool, decides: frozenset[str]) -> Row:
    counter = CountingCapture()
    pyspy.dump_pyspy = counter  # type: ignore[assignment]
    progress.STACK_DECIDES = decides  # type: ignore[misc]
    with tempfile.TemporaryDirectory() as tmp:
        watcher = make_watcher(Path(tmp), job, Said(), stall_timeout=45.0)
        watcher.tick(time.time())
        writers = state_files(watcher)
        cpu0, times, began = cpu_seconds(), [], time.perf_counter()
        for seq in range(1, ticks + 1):
            if progressing:
                for writer in writers:
                    writer.marker(seq, time.time())
            started = time.perf_counter()
            watcher.tick(time.time())
            times.append(time.perf_counter() - started)
            time.sleep(max(0.0, INTERVAL - times[-1]))
        watcher.background.close()
        time.sleep(0.5)   # the samples still running finish (counted, and their CPU reaped)
        cpu = (cpu_seconds() - cpu0) / (time.perf_counter() - began)
        watcher.store.close()
        for writer in writers:
            writer.close()
    pyspy.dump_pyspy = counter.inner  # type: ignore[assignment]
    times.sort()
    return Row(name, statistics.median(times) * 1e3, times[int(0.95 * (len(times) - 1))] * 1e3,
               cpu * 100, counter.count, counter.seconds * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--bystanders", type=int, default=400)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--busy", type=int, default=12,
                        help="ranks that burn their CPU (the others sleep): 12 at nice 19 on 2 "
                             "cores each get about 16 %%, over the 10 %% that makes a rank busy")
    args = parser.parse_args()
    others = bystanders(args.bystanders)
    os.environ["BUSY_RANKS"] = str(args.busy)
    job = start_job(args.ranks, args.workers, 0.0, BUSY_RANK)
    now_decides = progress.STACK_DECIDES
    try:
        print(f"{os.cpu_count()} cores, {args.ranks} ranks ({args.busy} busy) x {args.workers} workers, "
              f"{args.ticks} ticks at {INTERVAL:.0f} s, load {os.getloadavg()[0]:.1f}")
        print(f"{'':26} {'tick ms':>8} {'p95 ms':>7} {'cpu %':>6} {'py-spy':>6} "
              f"{'their wall ms':>13}")
        rows = [measure("progressing, before", job, args.ticks, True, EVERY_BASIS),
                measure("progressing", job, args.ticks, True, now_decides),
                measure("no progress", job, args.ticks, False, now_decides)]
        for row in rows:
            print(f"{row.name:26} {row.median_ms:>8.1f} {row.p95_ms:>7.1f} {row.cpu_percent:>6.1f} "
                  f"{row.samples:>6} {row.pyspy_ms:>13.0f}")
        before, now = rows[0], rows[1]
        print(f"progressing: watcher CPU {before.cpu_percent:.1f} % -> {now.cpu_percent:.1f} % "
              f"(ratio {now.cpu_percent / before.cpu_percent:.2f}), py-spy samples "
              f"{before.samples} -> {now.samples}")
        per_tick = rows[2].pyspy_ms / args.ticks
        print(f"no progress: py-spy {per_tick:.0f} ms a tick on average, off the tick "
              f"(median tick {rows[2].median_ms:.0f} ms, ratio "
              f"{rows[2].median_ms / now.median_ms:.2f} to the progressing one)")
    finally:
        kill_group(job)
        kill_group(others.pid)
        others.wait()


if __name__ == "__main__":
    main()
