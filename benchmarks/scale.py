"""The watcher at scale: the real ``Watcher.tick`` over stand-in jobs of 8, 32, 64 and 128 ranks,
each rank with 0 or 8 child processes, with unrelated processes on the node (400 by default).

Stand-in ranks are plain Python processes started like torchrun's (RANK, LOCAL_RANK, WORLD_SIZE
in their environment; ``tick_cost.py``'s launcher and ranks), each with an agent state file in
the watcher's agent directory. The watcher is the real one (``watch.Watcher``, with attach's
link in place of the relay: no GPUs, no Flight Recorder). Printed per size:

- tick ms: the median and p95 of ``Watcher.tick`` (target <= 100 ms at 64 ranks x 8 workers);
- cpu %: the watcher's CPU (its threads and the py-spy it ran) per tick over one tick period at
  the default 1 s interval, as a share of one core (target <= 10 % at 64 x 8);
- cpu ms: the watcher's CPU per tick (less sensitive to a loaded machine than the tick's wall
  time);
- bare ms: one bare pass over the process table in the same run (the floor of any scan).

Then at 64 ranks (``--stall-ranks``): the stand-ins never progress, so lowering the stall floor
makes the next tick declare a stall; the time from the STALL line to the end of the diagnosis
(stacks of every rank, rules, the printed findings; target <= 2 s), with a socket table as large
as 64 ranks connected full-mesh (another process holds the 2016 loopback connections), and the
connections probe alone against reading the table once per process (psutil's per-process
connections: how it was read before) measured in the same run.

    python benchmarks/scale.py [--ranks 8 32 64 128] [--workers 0 8] [--ticks 15]

Run on demand; the figures depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, cast

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tick_cost import LAUNCHER, RANK, bare_pass, stop_job, timed  # noqa: E402

from stalldoc.agent.statefile import StateWriter, state_path  # noqa: E402
from stalldoc.attach.link import AttachLink  # noqa: E402
from stalldoc.run.job import JobTree  # noqa: E402
from stalldoc.run.options import WatchOptions  # noqa: E402
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.connections import external_peers  # noqa: E402
from stalldoc.sidecar.link import RelayLink  # noqa: E402
from stalldoc.sidecar.watcher import Watcher  # noqa: E402

INTERVAL = 1.0   # the watcher's default tick interval
MESH = r'''
import socket, sys, time
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(4096)
kept = []
for _ in range(int(sys.argv[1])):
    kept.append(socket.create_connection(server.getsockname())); kept.append(server.accept()[0])
print("ready", flush=True)
time.sleep(3600)
'''


@dataclass(frozen=True)
class Row:
    ranks: int
    workers: int
    processes: int
    median_ms: float
    p95_ms: float
    cpu_ms: float
    cpu_percent: float
    bare_ms: float


class Said(io.StringIO):
    """The watcher's printed lines, each with the time it was printed."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.lines.append((time.perf_counter(), text))
        return len(text)

    def first(self, prefix: str) -> float | None:
        return next((t for t, line in self.lines if line.startswith(prefix)), None)


def start_job(ranks: int, workers: int, duty: float, rank_code: str = RANK) -> int:
    """tick_cost's launcher with ``ranks`` stand-in ranks (``rank_code``) of ``workers`` forked
    workers each, not a child of this process (the watcher leaves its own tree out of the job);
    its pid, which is also its process group."""
    read, write = os.pipe()
    subprocess.run(["setsid", "bash", "-c", f'"$@" >/dev/null 2>&1 </dev/null {write}>&- & echo $! >&{write}',
                    "job", sys.executable, "-c", LAUNCHER, rank_code, str(duty),
                    *[str(workers)] * ranks], pass_fds=(write,), check=True)
    os.close(write)
    with os.fdopen(read) as pipe:
        pid = int(pipe.read().strip())
    total = 1 + ranks * (1 + workers)
    deadline = time.time() + 300
    while time.time() < deadline:
        if 1 + len(psutil.Process(pid).children(recursive=True)) >= total:
            return pid
        time.sleep(0.2)
    kill_group(pid)
    raise SystemExit(f"the job of {total} processes did not start in 300 s")


def kill_group(pid: int) -> None:
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_group(argv: list[str], ready: bool = False) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, start_new_session=True,
                            stdout=subprocess.PIPE if ready else None)
    if ready:
        assert proc.stdout is not None
        proc.stdout.readline()
    return proc


def bystanders(count: int) -> subprocess.Popen[bytes]:
    """``count`` unrelated processes on the node, in a session of their own."""
    proc = start_group(["bash", "-c", f"for i in $(seq {count}); do sleep 3600 & done; wait"])
    deadline = time.time() + 60
    while len(psutil.Process(proc.pid).children()) < count and time.time() < deadline:
        time.sleep(0.1)
    return proc


def make_watcher(run_dir: Path, job_pid: int, out: Said, stall_timeout: float = 3600.0
                 ) -> Watcher:
    options = WatchOptions(("stand-in",), run_dir, stall_timeout=stall_timeout, agent=True,
                           gpus=False, flight_recorder=False)
    watcher = Watcher(options, cast(RelayLink, AttachLink(out, job_pid, time.time())))
    watcher.job = JobTree(job_pid, os.getpid())
    watcher.store.start_run(run_dir.name, ["stand-in"], "bench", time.time(), stall_timeout, True)
    return watcher


def cpu_seconds() -> float:
    """This process's CPU (all its threads) and its reaped children's (py-spy)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def state_files(watcher: Watcher) -> list[StateWriter]:
    """One agent state file per stand-in rank, as the agent would write it."""
    assert watcher.agent_dir is not None
    os.makedirs(watcher.agent_dir, mode=0o700, exist_ok=True)
    ranks = watcher.ranks.values()
    return [StateWriter(state_path(watcher.agent_dir, r.pid), r.pid, r.rank, r.rank, len(ranks),
                        time.time()) for r in ranks]


def measure(ranks: int, workers: int, ticks: int, duty: float, stall: bool) -> tuple[Row, str]:
    job = start_job(ranks, workers, duty)
    mesh = start_group([sys.executable, "-c", MESH, str(ranks * (ranks - 1) // 2)], ready=True) \
        if stall else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Said()
            watcher = make_watcher(Path(tmp), job, out)
            watcher.tick(time.time())            # the first: every environment read
            writers = state_files(watcher)
            processes = len(watcher.found.pids) if watcher.found else 0
            cpu0, times = cpu_seconds(), timed(lambda: watcher.tick(time.time()), ticks, 0.2)
            cpu = (cpu_seconds() - cpu0) / ticks
            period = statistics.median(times) + INTERVAL
            row = Row(ranks, workers, processes, statistics.median(times) * 1e3,
                      times[int(0.95 * (len(times) - 1))] * 1e3, cpu * 1e3, cpu / period * 100,
                      statistics.median(timed(bare_pass, ticks, 0.05)) * 1e3)
            extra = diagnose(watcher, out) if stall else ""
            watcher.background.close()
            watcher.store.close()
            for writer in writers:
                writer.close()
            return row, extra
    finally:
        kill_group(job)
        if mesh is not None:
            stop_job(mesh)


def diagnose(watcher: Watcher, out: Said) -> str:
    """Lower the floor: the next tick declares the stall and diagnoses it."""
    watcher.tracker.floor = 0.5
    time.sleep(0.6)
    done: list[float] = []
    inner = watcher._diagnose

    def timed_diagnose(*args: object) -> None:
        inner(*args)  # type: ignore[arg-type]
        done.append(time.perf_counter())

    watcher._diagnose = timed_diagnose  # type: ignore[method-assign]
    watcher.tick(time.time())
    stall_at = out.first("STALL #")
    printed = out.first("diagnosis:")
    if stall_at is None or not done:
        return "no stall was declared"
    live = list(watcher.ranks.values())
    job = list(watcher.parents)
    once = timed(lambda: external_peers(live, job), 3, 0)[1]
    per_process = timed(lambda: per_process_peers(live, job), 3, 0)[1]
    said = f"{printed - stall_at:.2f} s to the printed findings" if printed else "no findings"
    return (f"stall -> diagnosis at {len(live)} ranks: {done[0] - stall_at:.2f} s ({said}); "
            f"connections probe {once * 1e3:.0f} ms, read per process {per_process * 1e3:.0f} ms "
            f"({per_process / once:.0f}x)")


def per_process_peers(ranks: Iterable[RankProcess], job_pids: Iterable[int]) -> int:
    """The baseline: every process's connections read on their own (the table parsed each time),
    as the probe did before."""
    def tcp(pid: int) -> list:
        try:
            return psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            return []
    pids = list(job_pids)
    own = [c for pid in pids for c in tcp(pid)] + [c for pid in pids for c in tcp(pid)]
    return len(own) + sum(len(tcp(r.pid)) for r in ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 64, 128])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 8])
    parser.add_argument("--bystanders", type=int, default=400)
    parser.add_argument("--ticks", type=int, default=15)
    parser.add_argument("--duty", type=float, default=0.0,
                        help="share of the time each rank's first worker is on the CPU")
    parser.add_argument("--stall-ranks", type=int, default=64)
    args = parser.parse_args()
    others = bystanders(args.bystanders)
    try:
        print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
              f"{len(psutil.pids())} processes on the machine before the jobs")
        print(f"{'ranks':>5} {'workers':>7} {'procs':>5} {'tick ms':>8} {'p95 ms':>7} "
              f"{'cpu ms':>6} {'cpu %':>6} {'bare ms':>7} {'ratio':>6}")
        notes = []
        for ranks in args.ranks:
            for workers in args.workers:
                stall = ranks == args.stall_ranks and workers == max(args.workers)
                row, extra = measure(ranks, workers, args.ticks, args.duty, stall)
                print(f"{row.ranks:>5} {row.workers:>7} {row.processes:>5} {row.median_ms:>8.1f} "
                      f"{row.p95_ms:>7.1f} {row.cpu_ms:>6.1f} {row.cpu_percent:>6.1f} {row.bare_ms:>7.2f} "
                      f"{row.median_ms / row.bare_ms:>5.1f}x", flush=True)
                if extra:
                    notes.append(extra)
        for note in notes:
            print(note)
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        os.killpg(others.pid, signal.SIGKILL)
        others.wait()


if __name__ == "__main__":
    main()
