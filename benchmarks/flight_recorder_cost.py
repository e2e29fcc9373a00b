"""Flight Recorder cost beside the agent's: µs per small gloo all_reduce for plain,
torch's Flight Recorder on (TORCH_FR_BUFFER_SIZE=2000, as stalldoc sets it), the agent on (its
Flight Recorder opt-out), and both (what ``stalldoc watch`` does by default). All four are
measured in the same run, interleaved ``--rounds`` times; each figure is the median over rounds
of the best block of a round, and the ratios are against plain.

    python benchmarks/flight_recorder_cost.py [--rounds 5] [--iters 2000]
    python benchmarks/flight_recorder_cost.py --backend nccl --worlds 1   # on one GPU

Two worlds: 2 ranks (the real figure, but a 2-process gloo round trip on a busy host jitters by
tens of µs) and 1 rank (no peer to wait for: the recorder's own work per call shows). Each
configuration is fresh processes (the buffer size is read when the process group is made),
started directly with RANK / WORLD_SIZE / MASTER_* (no launcher).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from stalldoc.analysis.flight_recorder import flight_gaps, read_dumps  # noqa: E402
from stalldoc.run.inject import agent_environment  # noqa: E402

LOOP = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    backend = os.environ["BENCH_BACKEND"]
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    t = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
    iters = int(sys.argv[1])
    def sync():
        if backend == "nccl":
            torch.cuda.synchronize()
    def block():
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        sync()
        return (time.perf_counter() - t0) / iters
    for _ in range(300):
        dist.all_reduce(t)
    best = min(block() for _ in range(5))
    if dist.get_rank() == 0:
        entries, dump_s = 0, 0.0
        if os.environ.get("TORCH_FR_BUFFER_SIZE"):
            import pickle
            from stalldoc.agent.flight import dist_dump, write_atomic
            t0 = time.perf_counter()
            data = dist_dump(torch, dist, stacks=False)     # this job never imported inductor
            dump_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            data = dist_dump(torch, dist, stacks=True)      # imports torch._inductor first
            frames_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            data = dist_dump(torch, dist, stacks=True)
            write_atomic(sys.argv[2], "rank_0", data)
            again_s = time.perf_counter() - t0
            entries = len(pickle.loads(data)["entries"])
            dump_s = f"{dump_s},{frames_s},{again_s}"
        print(best, entries, dump_s or "0,0,0", flush=True)
    dist.destroy_process_group()
""")

CONFIGS = ("plain", "flight recorder", "agent", "both")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(config: str, run_dir: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("TORCH_FR_", "TORCH_NCCL_TRACE", "STALLDOC_"))}
    base["OMP_NUM_THREADS"] = "1"
    if config == "plain":
        return base
    if config == "flight recorder":
        return {**base, "TORCH_FR_BUFFER_SIZE": "2000"}
    return agent_environment(run_dir, base, os.getpid(), flight_recorder=config == "both")


def run_pair(config: str, iters: int, run_dir: Path, world: int, backend: str
             ) -> tuple[float, int, list[float]]:
    env = {**environment(config, run_dir), "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "BENCH_BACKEND": backend,
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    procs = [subprocess.Popen([sys.executable, "-c", LOOP, str(iters), str(run_dir)], text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE) for r in range(world)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{config}: a rank failed")
    seconds, entries, dump_s = outs[0].split()
    return float(seconds), int(entries), [float(x) for x in dump_s.split(",")]


def measure(world: int, rounds: int, iters: int, tmp: Path, backend: str) -> None:
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    entries: dict[str, int] = {}
    dumps: list[list[float]] = []
    for n in range(rounds):
        for config in CONFIGS if n % 2 == 0 else reversed(CONFIGS):
            run_dir = tmp / f"{world}-{n}-{config.replace(' ', '-')}"
            run_dir.mkdir()
            seconds, entries[config], dump_s = run_pair(config, iters, run_dir, world, backend)
            times[config].append(seconds)
            if dump_s[0]:
                dumps.append(dump_s)
                last_dump = run_dir
    med = {c: statistics.median(v) for c, v in times.items()}
    print(f"\n{backend} all_reduce of 1 float, world {world}, {iters} per block, best of 5 blocks, "
          f"median of {rounds} rounds (interleaved)")
    print(f"{'config':<16} {'us/collective':>14} {'vs plain':>9} {'spread (us)':>14} "
          f"{'FR entries':>10}")
    for config in CONFIGS:
        spread = f"{min(times[config]) * 1e6:.1f}-{max(times[config]) * 1e6:.1f}"
        print(f"{config:<16} {med[config] * 1e6:>14.1f} {med[config] / med['plain']:>9.3f} "
              f"{spread:>14} {entries[config]:>10}")
    print(f"flight recorder adds {(med['flight recorder'] - med['plain']) * 1e6:+.1f} us per "
          f"collective alone, {(med['both'] - med['agent']) * 1e6:+.1f} us beside the agent; "
          f"the agent adds {(med['agent'] - med['plain']) * 1e6:+.1f} us")
    t0 = time.perf_counter()
    for _ in range(10):
        flight_gaps(read_dumps(last_dump)[0], {0})
    read_s = (time.perf_counter() - t0) / 10
    size = (last_dump / "rank_0").stat().st_size
    plain_dump, first, later = (statistics.median(d[i] for d in dumps) * 1e3 for i in range(3))
    print(f"on a stall, {max(entries.values())} entries: the agent's dump takes {plain_dump:.2f} "
          f"ms without frames; with frames {first:.0f} ms the first time (torch imports "
          f"torch._inductor to symbolize them), {later:.1f} ms after; the watcher reads and "
          f"aligns a dump with frames ({size / 1024:.0f} KiB) in {read_s * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="nccl: on GPUs, one per rank (on one GPU: --worlds 1)")
    parser.add_argument("--worlds", default="1,2", help="world sizes, comma separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for world in (int(w) for w in args.worlds.split(",")):
            measure(world, args.rounds, args.iters, Path(tmp), args.backend)


if __name__ == "__main__":
    main()
