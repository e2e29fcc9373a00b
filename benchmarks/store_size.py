"""The run store over a long run: its size on disk, the write cost per tick, and the cost of
``stalldoc report`` on it, with the retention policy against the same feed without retention.

A GRPO-like run is fed through the real RunStore tick by tick (simulated clock, 1 s interval):
every rank's host sample, every GPU, the node, the probes, phases ending (a 60 s step of six
phases), ``--collectives`` new all_reduce calls a second in each rank's ring (64 by default: a
ring turned over whole every tick, of which the store keeps the newest; the same run without
them is measured too, and the ratios printed), the job printing a few lines a second, three
stalls with their stacks and findings, and tick findings opening and resolving. The baseline keeps every row (no retention) for
``--baseline-hours`` and is extrapolated to the run's length.

    python benchmarks/store_size.py                       # 24 h, 64 ranks, 8 GPUs
    python benchmarks/store_size.py --hours 2 --ranks 8   # quicker
    python benchmarks/store_size.py --collectives 0       # without the collectives run
Targets (issue 13): 24 h x 64 ranks x 8 GPUs <= 200 MB on disk; its report <= 5 s, <= 300 MB.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stalldoc.model.agent import AgentSnapshot, PhaseRecord
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.findings.ledger import Ledger  # noqa: E402
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import GpuProcess, GpuSample, HostMemory, HostSample, LogLine, ProbeRun
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import StallEpisode
from stalldoc.model.samples import Tick
from stalldoc.store.db import RunStore  # noqa: E402
from stalldoc.store.retention import RetentionPolicy  # noqa: E402

T0 = 1_790_000_000.0
PHASES = ("rollout", "generate", "reward", "step", "weight_sync", "offload_model")
LINE = ("Train: {pct}%|███▌      | {i}/86400 [00:{s:02d}<10:00, 1.2it/s] {{'loss': 0.0123, "
        "'grad_norm': 0.52, 'learning_rate': 9.9e-07, 'reward': 0.61, 'completions/mean_length'"
        ": 412.5}}")
NO_RETENTION = RetentionPolicy(full_resolution_seconds=1e12, log_head_bytes=1 << 62)


class Feed:
    """Ticks of a run with ``ranks`` ranks and ``gpus`` GPUs, cheap to make."""

    def __init__(self, ranks: int, gpus: int, collectives: int = 0) -> None:
        self.ranks, self.gpus, self.collectives = ranks, gpus, collectives
        self.rings: dict[int, tuple[PhaseRecord, ...]] = {r: () for r in range(ranks)}

    def groups(self, i: int, rank: int) -> tuple[GroupState, ...]:
        """The rank's ring of the world group: the latest 64 of ``collectives`` a second."""
        if not self.collectives:
            return ()
        last, t = (i + 1) * self.collectives, T0 + i
        calls = tuple(CollectiveRecord("world", s, "all_reduce", 1 << 20, "bfloat16",
                                       t - (last - s) * 1e-3 + rank * 1e-5,
                                       t - (last - s) * 1e-3 + 5e-4, False)
                      for s in range(max(1, last - 63), last + 1))
        return (GroupState("world", last, last, calls),)

    def tick(self, i: int) -> Tick:
        t = T0 + i
        phase = PHASES[(i // 10) % len(PHASES)]
        if i % 10 == 9:
            for r in range(self.ranks):
                self.rings[r] = (self.rings[r] + (PhaseRecord(phase, t - 9.5 + r * 1e-3, t),))[-16:]
        host = {r: HostSample(t, r, 1000 + r, i * 0.9, (20 << 30) + (i * 7919 + r) % (1 << 30), 64,
                              "running", 1 << 40, 90.0 + (i + r) % 10, 2, 5.0, 1e5 + r)
                for r in range(self.ranks)}
        agents = {r: AgentSnapshot(1000 + r, r, r % 8, self.ranks, 0, T0, t, i, t, None,
                                   ("train", phase), "", len(self.rings[r]), self.rings[r],
                                   self.groups(i, r))
                  for r in range(self.ranks)}
        gpus = tuple(GpuSample(t, g, f"GPU-{g}", "NVIDIA H100 80GB HBM3",
                               (60 << 30) + (i * 104729 + g) % (1 << 32), 80 << 30, (i + g) % 101,
                               (i * 3 + g) % 101, 2e9 + g, 1e9 + g, 550.0,
                               (GpuProcess(1000 + g, 59 << 30, g),)) for g in range(self.gpus))
        node = HostMemory(t, 1 << 40, 2 << 40, 0.0, 0.0, 40.0, 192)
        probes = tuple(ProbeRun(name, t, True, 0.004) for name in ("host", "node", "nvml", "agent"))
        return Tick(t, host, node, gpus, agents, probes)


def _events(store: RunStore, ledger: Ledger, i: int, ranks: int) -> None:
    """Three stalls a day with stacks and findings; a slow-rank finding every 40 minutes, for
    a second."""
    t = T0 + i
    if i % 28_800 == 14_400:
        stall = i // 28_800 + 1
        store.save_stall(StallEpisode(stall, t - 45, t, 45, tuple(range(ranks))))
        store.add_stacks(stall, [RankStacks(r, 1000 + r, t, "py-spy", ()) for r in range(ranks)])
        store.put_findings(ledger.stall(t, stall, [Finding(
            "SD101", "rank-outside-collective", Severity.ERROR, (3,),
            "rank 3 not in all_reduce #9", {}, "fix")]).entries)
    if i % 2400 == 1200:
        store.put_findings(ledger.tick(t, [Finding("SD108", "slow-rank", Severity.WARNING, (0,),
                                                    "rank 0 slow", {}, "wait")]).entries)
    if i % 2400 == 1201:
        store.put_findings(ledger.tick(t, []).entries)


def fill(run_dir: Path, seconds: int, ranks: int, gpus: int, lines_per_s: int,
         policy: RetentionPolicy, collectives: int) -> float:
    """Feed ``seconds`` of the run; the mean write cost per tick in ms."""
    store = RunStore(run_dir, policy)
    store.start_run(run_dir.name, ["swift", "rlhf", "--rlhf_type", "grpo"], "node", T0, 45, True)
    feed, spent, ledger = Feed(ranks, gpus, collectives), 0.0, Ledger()
    for i in range(seconds):
        tick = feed.tick(i)
        lines = [LogLine(tick.t, "stderr", LINE.format(pct=i * 100 // 86400, i=i, s=i % 60))
                 for _ in range(lines_per_s)]
        started = time.perf_counter()
        store.add_logs(lines)
        store.add_tick(tick)
        _events(store, ledger, i, ranks)
        store.compact(tick.t, 45 + policy.around_before)
        spent += time.perf_counter() - started
    store.end_run(T0 + seconds, 0)
    store.close()
    return 1000 * spent / seconds


def report_cost(run_dir: Path) -> tuple[float, float]:
    """(seconds, peak MB) of ``stalldoc report --format json`` on the run, in a fresh process."""
    code = ("import resource, sys; from stalldoc.cli import main\n"
            "try:\n    main(['report', sys.argv[1], '--format', 'json'])\n"
            "except SystemExit as end:\n    assert not end.code, 'the report failed'\n"
            "sys.stderr.write(f'{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    return time.perf_counter() - started, int(out.stderr.split()[-1]) / 1024


def size_mb(run_dir: Path) -> float:
    return sum(p.stat().st_size for p in run_dir.iterdir()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--baseline-hours", type=float, default=1)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--lines-per-second", type=int, default=5)
    parser.add_argument("--collectives", type=int, default=64,
                        help="new collectives a second in each rank's ring (0: none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"retention": (Path(tmp) / "retention", args.hours, RetentionPolicy(),
                              args.collectives),
                "none (baseline)": (Path(tmp) / "baseline", args.baseline_hours, NO_RETENTION,
                                    args.collectives)}
        if args.collectives:
            runs["retention, no collectives"] = (Path(tmp) / "bare", args.hours,
                                                 RetentionPolicy(), 0)
        print(f"{args.ranks} ranks, {args.gpus} GPUs, {args.lines_per_second} log lines/s, "
              f"1 s interval; baseline over {args.baseline_hours:g} h, extrapolated")
        print("| retention | hours | store MB | MB per 24 h | write ms/tick | report s | "
              "report peak MB |\n|---|---|---|---|---|---|---|")
        per_day, write = {}, {}
        for name, (run_dir, hours, policy, collectives) in runs.items():
            run_dir.mkdir()
            write[name] = write_ms = fill(run_dir, int(hours * 3600), args.ranks, args.gpus,
                                          args.lines_per_second, policy, collectives)
            seconds, peak = report_cost(run_dir)
            size = size_mb(run_dir)
            per_day[name] = size * 24 / hours
            print(f"| {name} | {hours:g} | {size:.1f} | {per_day[name]:.0f} | {write_ms:.2f} | "
                  f"{seconds:.2f} | {peak:.0f} |")
        print(f"\nsize per day with retention / without: "
              f"{per_day['retention'] / per_day['none (baseline)']:.3f}")
        if args.collectives:
            bare = "retention, no collectives"
            print(f"with {args.collectives} collectives/s per rank / without: store size "
                  f"{per_day['retention'] / per_day[bare]:.2f}, write per tick "
                  f"{write['retention'] / write[bare]:.2f}")


if __name__ == "__main__":
    main()
