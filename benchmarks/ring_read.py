"""Watcher cost of reading the agents' collective rings: a full decode of every ring each tick
(what the watcher did before issue 17: ``read_state``) against the incremental read (only the
entries new since the last read, and pending ones), in the same run, per state file and tick.

    python benchmarks/ring_read.py [--ticks 400]

Each case writes ``new`` collectives into a rank's rings between two reads (groups: world and
one more); the figure is the median read time of one state file, the ratio is incremental / full.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.agent.state_reader import IncrementalReader, read_state  # noqa: E402
from stalldoc.agent.statefile import RING_SLOTS, GroupRing, StateWriter  # noqa: E402

CASES = (0, 1, 8, 32, RING_SLOTS, 4 * RING_SLOTS)   # collectives per group between two reads


def _issue(rings: list[GroupRing], count: int) -> None:
    for ring in rings:
        for _ in range(count):
            offset = ring.enter(b"all_reduce", 1024, b"float32", 0, time.time())
            ring.exit(offset, time.time())


def _median_read(read, path: str, rings: list[GroupRing], new: int, ticks: int) -> float:
    times = []
    for _ in range(ticks):
        _issue(rings, new)
        t0 = time.perf_counter()
        read(path)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=400)
    ticks = parser.parse_args().ticks
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "agent-1.state")
        writer = StateWriter(path, 1, 0, 0, 2, time.time())
        rings = [writer.group_ring(0, "world"), writer.group_ring(1, "tp")]
        _issue(rings, RING_SLOTS)
        print(f"{'new per group and read':>24} {'full read (us)':>15} {'incremental (us)':>17} "
              f"{'ratio':>6}")
        for new in CASES:
            incremental = IncrementalReader()
            full = _median_read(read_state, path, rings, new, ticks)
            inc = _median_read(incremental.read, path, rings, new, ticks)
            print(f"{new:>24} {full * 1e6:>15.1f} {inc * 1e6:>17.1f} {inc / full:>6.2f}")
        wrapped = incremental.read(path).groups[0].wrapped
        print(f"collectives counted as wrapped in the last case, per group: {wrapped} (expected "
              f"{(ticks - 1) * (CASES[-1] - RING_SLOTS)}: {CASES[-1] - RING_SLOTS} overwritten "
              f"unread at each read after the first)")
        writer.close()


if __name__ == "__main__":
    main()
