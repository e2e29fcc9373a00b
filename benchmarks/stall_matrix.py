"""False stalls and detection latency over real workloads, with and without a CPU burner.

Each healthy kind (tests/scenarios/healthy_phases.py: compute on one line, a C call, one rank
writing a checkpoint or reading an eval set from slow storage, worker processes, slow loading)
runs a phase longer than the stall timeout: any stall declared is a false stall (target 0).
Each hang kind (tests/scenarios/hang_kinds.py: queue get, lock, sleep poll, socket read) is timed
from the moment the stuck rank entered the hang (it prints the time) to the stall's detection
and to the first finding naming it (target: stall timeout + 5 s; at the default timeout, 60 s).
The stall timeout is the baseline each latency is set against (ratio column).

    python benchmarks/stall_matrix.py [--timeout S | --defaults] [--phase-seconds S]
                                      [--kinds a,b,...] [--no-load] [--load-only]

``--defaults`` runs watch without --stall-timeout / --interval (45 s, 1 s): healthy phases then
last --phase-seconds (default 2.5 x the timeout).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from load import cpu_burner, silent_server, slow_reader, slow_writer  # noqa: E402
from support import torchrun  # noqa: E402

MB = 1 << 20
HEALTHY = {"matmul_loop": 2, "long_forward": 3, "c_extension_call": 2,
           "checkpoint_one_rank": 3, "evaluation_one_rank": 2, "pool_preprocess": 2,
           "datasets_map": 2, "dataloader_workers": 3, "slow_storage_load": 2}
HANGS = {"queue_get": (3, 2), "lock": (2, 0), "sleep_poll": (4, 3), "socket_read": (2, 1)}
DEFAULT_TIMEOUT = 45.0


@contextlib.contextmanager
def storage(kind: str, nproc: int, tmp: str, seconds: float) -> Iterator[dict[str, str]]:
    path, rate = os.path.join(tmp, "slow"), 3 * MB
    total = int(seconds * rate)
    with contextlib.ExitStack() as stack:
        if kind == "checkpoint_one_rank":
            stack.enter_context(slow_reader(path, rate))
        elif kind == "evaluation_one_rank":
            stack.enter_context(slow_writer(path, total, rate))
        elif kind == "slow_storage_load":
            for rank in range(nproc):
                stack.enter_context(slow_writer(f"{path}.{rank}", total, rate))
        yield {"SLOW_PATH": path, "PHASE_MB": str(total // MB)}


def watch(tmp: str, argv: list[str], env: dict[str, str], timeout: float | None,
          ) -> tuple[dict, str, float]:
    run_dir = os.path.join(tmp, "run")
    flags = ["--stall-timeout", str(timeout), "--interval", "0.5"] if timeout else []
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "stalldoc", "watch", "--run-dir", run_dir,
                           *flags, "--on-stall", "kill", "--kill-grace", "3", "--", *argv],
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, text=True,
                          capture_output=True, timeout=1800)
    wall = time.time() - started
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "stalldoc", "report", run_dir, "--format", "json"],
        capture_output=True, text=True, check=True).stdout)
    return report, proc.stdout, wall


def healthy(kind: str, loaded: bool, timeout: float | None, seconds: float) -> list[str]:
    nproc = HEALTHY[kind]
    with tempfile.TemporaryDirectory() as tmp, storage(kind, nproc, tmp, seconds) as env, \
            (cpu_burner(2) if loaded else contextlib.nullcontext()):
        env = {**env, "PHASE": kind, "PHASE_SECONDS": str(seconds)}
        report, out, wall = watch(tmp, torchrun(nproc, "healthy_phases.py"), env, timeout)
    phase = re.search(rf"{kind}: done in ([\d.]+) s", out)
    slow = sum(1 for f in report["findings"] if f["code"] == "SD108")
    return [kind, "loaded" if loaded else "idle", str(nproc),
            f"{float(phase.group(1)):.1f}" if phase else "?", str(len(report["stalls"])),
            str(slow), "", "", "", f"{wall:.0f}"]


def hang(kind: str, loaded: bool, timeout: float | None) -> list[str]:
    nproc, stuck = HANGS[kind]
    with tempfile.TemporaryDirectory() as tmp, silent_server() as port, \
            (cpu_burner(2) if loaded else contextlib.nullcontext()):
        env = {"HANG": kind, "HANG_RANK": str(stuck), "SERVER_PORT": str(port)}
        report, out, wall = watch(tmp, torchrun(nproc, "hang_kinds.py"), env, timeout)
    entered = float(re.search(r"hang starts at ([\d.]+)", out).group(1))
    stalls = report["stalls"]
    named = [f for f in report["findings"] if stuck in f["ranks"] and f["trigger"] == "stall"]
    detect = stalls[0]["detected_at"] - entered if stalls else None
    finding = named[0]["t"] - entered if named else None
    base = timeout or DEFAULT_TIMEOUT
    return [kind, "loaded" if loaded else "idle", str(nproc), "", str(len(stalls)), "",
            f"{detect:.1f}" if detect is not None else "missed",
            f"{finding:.1f} ({named[0]['code']})" if finding is not None else "missed",
            f"{finding / base:.2f}" if finding is not None else "", f"{wall:.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--defaults", action="store_true")
    parser.add_argument("--phase-seconds", type=float, default=None)
    parser.add_argument("--kinds", default="")
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--load-only", action="store_true")
    args = parser.parse_args()
    timeout = None if args.defaults else args.timeout
    seconds = args.phase_seconds or 2.5 * (timeout or DEFAULT_TIMEOUT)
    kinds = set(args.kinds.split(",")) if args.kinds else set(HEALTHY) | set(HANGS)
    loads = [False] if args.no_load else [True] if args.load_only else [False, True]
    print(f"stall timeout: {timeout or f'default ({DEFAULT_TIMEOUT:.0f} s)'}; healthy phases "
          f"{seconds:.0f} s")
    print("| kind | load | ranks | phase s | stalls | SD108 | hang->stall s | hang->finding s "
          "| finding/timeout | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for loaded in loads:
        for kind in [k for k in HEALTHY if k in kinds]:
            print("| " + " | ".join(healthy(kind, loaded, timeout, seconds)) + " |", flush=True)
        for kind in [k for k in HANGS if k in kinds]:
            print("| " + " | ".join(hang(kind, loaded, timeout)) + " |", flush=True)


if __name__ == "__main__":
    main()
