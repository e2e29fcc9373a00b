"""Weight of ``stalldoc report --format html`` for a long, large run: 8 ranks on 8 GPUs, as
much as the reader keeps (20 000 phase spans and 20 000 collectives per run, ~1000 points per
rank / GPU / node). Prints the page's size, its ratio to plotly.js alone, and the render time.

    python benchmarks/html_size.py [--ranks 8]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.report.formats.html import REPORTER  # noqa: E402
from stalldoc.report.records import (CollectiveSpan, GpuPoint, HostSummary, NodePoint,  # noqa: E402
                                     PhaseSpan, RankPoint, RankRecord, Report, RunInfo,
                                     RunRecord, TimeSeries)
from stalldoc.report.read import MAX_SPANS  # noqa: E402

T0, HOURS, POINTS = 1_700_000_000.0, 6, 1000


def long_run(ranks: int) -> Report:
    seconds = HOURS * 3600.0
    per_rank = MAX_SPANS // ranks
    step = seconds / per_rank
    spans = tuple(PhaseSpan(r, ("rollout", "reward", "train")[i % 3], T0 + i * step,
                            T0 + (i + 0.9) * step) for r in range(ranks) for i in range(per_rank))
    colls = tuple(CollectiveSpan(r, "world", i, "all_reduce", 1 << 20, "bfloat16",
                                 T0 + i * step, T0 + (i + 0.1) * step)
                  for r in range(ranks) for i in range(per_rank))
    ticks = [T0 + seconds * i / POINTS for i in range(POINTS)]
    series = TimeSeries(
        tuple(RankPoint(t, r, "running", "train", 50.0, 8 << 30, 60 << 30, 50 << 30, 55 << 30)
              for r in range(ranks) for t in ticks),
        tuple(GpuPoint(t, g, memory_used=60 << 30, memory_total=80 << 30, pcie_tx_bps=1e9,
                       pcie_rx_bps=2e9) for g in range(ranks) for t in ticks),
        tuple(NodePoint(t, 100 << 30, 256 << 30) for t in ticks))
    info = RunInfo("long", ("swift", "rlhf"), "node", T0, T0 + seconds, 0, 45.0, True, 4)
    rank_records = tuple(RankRecord(r, 100 + r, r, ("python",), T0, node="node")
                         for r in range(ranks))
    return Report((RunRecord("/run", "node", info, rank_records, (), (), (), {}, HostSummary(),
                             (), (), (), (), series, spans, colls),))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    from plotly.offline import get_plotlyjs
    report = long_run(args.ranks)
    start = time.perf_counter()
    page = REPORTER.render(report)
    took = time.perf_counter() - start
    plotly = len(get_plotlyjs())
    print(f"{args.ranks} ranks, {HOURS} h: page {len(page) / 1e6:.1f} MB = "
          f"{len(page) / plotly:.2f} x plotly.js ({plotly / 1e6:.1f} MB); rendered in {took:.1f} s")


if __name__ == "__main__":
    main()
