"""The agent's one-time cost of learning which rank its process is (``agent/identity.py``):
reading the launcher's variables at start, and reading the process group the job just created
(rank, world size, the store's address) right after ``init_process_group`` returns. Baseline in
the same run: ``init_process_group`` itself (a one-rank gloo group over TCP) and the agent's whole
start-up cost.

    python benchmarks/identity_cost.py [--repeat 2000] [--inits 20]

Both figures are paid once per process (again only if a job re-creates its default group).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from stalldoc.agent import identity  # noqa: E402


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _per_call(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--inits", type=int, default=20)
    args = parser.parse_args()
    import torch.distributed as dist

    environ = {**os.environ, "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}
    at_start = _per_call(lambda: identity.from_environment(environ), args.repeat)
    inits, reads = [], []
    for _ in range(args.inits):
        method = f"tcp://127.0.0.1:{_port()}"
        started = time.perf_counter()
        dist.init_process_group("gloo", init_method=method, rank=0, world_size=1)
        inits.append(time.perf_counter() - started)
        reads.append(_per_call(lambda: identity.from_group(dist, method), 50))
        dist.destroy_process_group()
    init, read = statistics.median(inits), statistics.median(reads)
    print(f"claim from the environment at start: {at_start * 1e6:8.1f} us")
    print(f"claim from the process group:        {read * 1e6:8.1f} us (median of {args.inits})")
    print(f"init_process_group itself (baseline): {init * 1e6:7.0f} us")
    print(f"ratio, process-group claim / init_process_group: {read / init:.4f}")


if __name__ == "__main__":
    main()
