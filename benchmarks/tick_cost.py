"""Cost of the watcher's per-tick process work: discovery (one scan of the process table, the job
tree, the ranks) and ``Sampler.sample`` (host, node and agent probes; no NVML), for real job trees
of 8, 32 and 128 processes, against one bare pass over the process table measured in the same
run (``psutil.pids()`` and a read of every /proc/PID/stat: the floor of any one-pass scan).

Each job is a launcher with ranks started like torchrun's (RANK, LOCAL_RANK, WORLD_SIZE... in
their environment), each rank with forked workers (dataloader-like): one busy worker per rank
(on the CPU ``--duty`` of the time), the others asleep. Each rank has an agent state file and
holds ``--fds`` descriptors open, which its workers inherit (the TCP bytes probe reads each
process's descriptors).

    python benchmarks/tick_cost.py [--sizes 8 32 128] [--ticks 100] [--duty 0.1] [--fds 300]

Run on demand; the figures depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.agent.statefile import StateWriter, state_path  # noqa: E402
from stalldoc.run.job import JobTree  # noqa: E402
from stalldoc.model.ranks import RankProcess
from stalldoc.sidecar.sampling import Sampler  # noqa: E402

RANK = r'''
import os, sys, time
workers, duty = int(sys.argv[1]), float(sys.argv[2])
held = [open(os.devnull) for _ in range(int(os.environ.get("TICK_FDS", "0")))]
for n in range(workers):
    if os.fork() == 0:
        while n == 0 and duty > 0:          # the busy worker: duty x 100 ms on the CPU
            end = time.monotonic() + 0.1 * duty
            while time.monotonic() < end:
                pass
            time.sleep(0.1 * (1 - duty))
        time.sleep(3600)
        os._exit(0)
time.sleep(3600)
'''
LAUNCHER = r'''
import os, subprocess, sys, time
code, duty, counts = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3:]]
world = str(len(counts))
env = {**os.environ, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world, "GROUP_RANK": "0",
       "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": world,
       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
       "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
       "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
       "OMP_NUM_THREADS": "1"}
ranks = [subprocess.Popen([sys.executable, "-c", code, str(n), duty],
                          env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)})
         for r, n in enumerate(counts)]
time.sleep(3600)
'''


@dataclass(frozen=True)
class Row:
    processes: int
    ranks: int
    first_ms: float
    median_ms: float
    p95_ms: float
    base_ms: float


def layout(total: int) -> list[int]:
    """Workers per rank for a job of ``total`` processes (the launcher and the ranks included)."""
    ranks = max(2, total // 16)
    workers = total - 1 - ranks
    return [workers // ranks + (1 if r < workers % ranks else 0) for r in range(ranks)]


def start_job(total: int, duty: float) -> subprocess.Popen[bytes]:
    counts = layout(total)
    job = subprocess.Popen([sys.executable, "-c", LAUNCHER, RANK, str(duty), *map(str, counts)],
                           start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if 1 + len(psutil.Process(job.pid).children(recursive=True)) >= total:
            return job
        time.sleep(0.1)
    stop_job(job)
    raise SystemExit(f"the job of {total} processes did not start in 120 s")


def stop_job(job: subprocess.Popen[bytes]) -> None:
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def bare_pass() -> None:
    """The floor: every process's stat file read once, nothing parsed."""
    for pid in psutil.pids():
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            os.read(fd, 4096)
        except OSError:
            pass
        finally:
            os.close(fd)


def timed(fn: Callable[[], object], ticks: int, pause: float) -> list[float]:
    out = []
    for _ in range(ticks):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
        time.sleep(pause)
    return sorted(out)


def measure(total: int, ticks: int, pause: float, duty: float, agents: str) -> Row:
    job = start_job(total, duty)
    try:
        tree, sampler = JobTree(job.pid, os.getpid()), Sampler(agents, gpus=False)
        ranks: dict[int, RankProcess] = {}

        def tick() -> int:
            found = sampler.discover(tree, None, not ranks)
            ranks.update({r.rank: r for r in found.ranks})
            known = list(ranks.values())
            sampler.sample(time.time(), known, known, found.parents, found)
            return len(found.pids)

        started = time.perf_counter()
        processes = tick()                        # the first: every environment read
        first = time.perf_counter() - started
        writers = [StateWriter(state_path(agents, r.pid), r.pid, r.rank, r.rank, len(ranks),
                               time.time()) for r in ranks.values()]
        times = timed(tick, ticks, pause)
        base = timed(bare_pass, ticks, pause)
        for writer in writers:
            writer.close()
        return Row(processes, len(ranks), first * 1e3, statistics.median(times) * 1e3,
                   times[int(0.95 * (len(times) - 1))] * 1e3, statistics.median(base) * 1e3)
    finally:
        stop_job(job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between ticks")
    parser.add_argument("--duty", type=float, default=0.1,
                        help="share of the time each rank's busy worker is on the CPU")
    parser.add_argument("--fds", type=int, default=0,
                        help="descriptors each rank holds open, its workers too (a CUDA rank "
                             "holds hundreds: its devices, NCCL's sockets, shared memory)")
    args = parser.parse_args()
    os.environ["TICK_FDS"] = str(args.fds)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"{len(psutil.pids())} processes on the machine before the jobs")
    print(f"{'job procs':>9} {'ranks':>5} {'first ms':>8} {'tick ms':>8} {'p95 ms':>7} "
          f"{'bare ms':>7} {'ratio':>6} {'us/proc':>7}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as agents:
            row = measure(size, args.ticks, args.pause, args.duty, agents)
        print(f"{row.processes:>9} {row.ranks:>5} {row.first_ms:>8.1f} {row.median_ms:>8.1f} "
              f"{row.p95_ms:>7.1f} {row.base_ms:>7.2f} {row.median_ms / row.base_ms:>5.1f}x "
              f"{row.median_ms / row.processes * 1e3:>7.0f}")
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
