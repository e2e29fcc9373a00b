"""The agents' collective rings, before and after issue 17, in one run:

1. Watcher cost per state file and read: a full decode of every ring at each read (what the
   watcher did before: ``read_state``) against the incremental read (only the entries new since
   the last read, and pending ones), for ``new`` collectives per group between two reads (two
   groups).
2. A rank issuing 4x the ring's size between two reads: the collectives the watcher never read
   (overwritten first), which the reader of before dropped silently, against the count the
   incremental reader gives (``GroupState.wrapped``: exact from its first read on).

    python benchmarks/ring_read.py [--reads 300]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.agent.state_reader import IncrementalReader, read_state
from stalldoc.model.agent import AgentSnapshot
from stalldoc.agent.statefile import RING_SLOTS, StateWriter  # noqa: E402

CASES = (0, 1, 8, 32, RING_SLOTS)   # collectives per group between two reads
clock = [1000.0]


def _slow(rings: list[Any], count: int) -> None:
    """``count`` collectives per ring."""
    for ring in rings:
        for _ in range(count):
            clock[0] += 1.0
            ring.exit(ring.enter(b"all_reduce", 1024, b"float32", 0, clock[0]), clock[0])


def _fast(rings: list[Any], count: int) -> None:
    for ring in rings:
        for _ in range(count):
            now = time.time()
            ring.exit(ring.enter(b"all_reduce", 1024, b"float32", 0, now), now)


def _reads(read: Callable[[str], AgentSnapshot], path: str, issue: Callable[[int], None],
           new: int, reads: int) -> tuple[float, AgentSnapshot]:
    """Median time of one read after ``new`` collectives per group; the last snapshot."""
    times, state = [], None
    for _ in range(reads):
        issue(new)
        t0 = time.perf_counter()
        state = read(path)
        times.append(time.perf_counter() - t0)
    assert state is not None
    return statistics.median(times), state


def read_cost(tmp: str, reads: int) -> None:
    path = str(Path(tmp) / "agent-1.state")
    writer = StateWriter(path, 1, 0, 0, 2, time.time())
    rings = [writer.group_ring(0, "world"), writer.group_ring(1, "tp")]
    _slow(rings, RING_SLOTS)
    print(f"{'new per group and read':>24} {'full read (us)':>15} {'incremental (us)':>17} "
          f"{'ratio':>6}")
    for new in CASES:
        full, _ = _reads(read_state, path, lambda n: _slow(rings, n), new, reads)
        inc, _ = _reads(IncrementalReader().read, path, lambda n: _slow(rings, n), new, reads)
        print(f"{new:>24} {full * 1e6:>15.1f} {inc * 1e6:>17.1f} {inc / full:>6.2f}")
    writer.close()


def losses(tmp: str, reads: int) -> None:
    new = 4 * RING_SLOTS
    path = str(Path(tmp) / "agent-2.state")
    writer = StateWriter(path, 2, 0, 0, 1, time.time())
    ring, reader, seen = writer.group_ring(0, "world"), IncrementalReader(), set()

    def read(p: str) -> AgentSnapshot:
        state = reader.read(p)
        seen.update(r.seq for r in state.groups[0].ring)
        return state

    cost, state = _reads(read, path, lambda n: _fast([ring], n), new, reads)
    group = state.groups[0]
    before_first = new - RING_SLOTS         # overwritten before the first read: not counted
    print(f"\n{new} collectives per read, {reads} reads: {group.started} collectives, "
          f"{len(seen)} read, {group.started - len(seen)} never read (before: dropped silently; "
          f"now: {group.wrapped} counted as wrapped + {before_first} before the first read); "
          f"read {cost * 1e6:.1f} us")
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=300)
    reads = parser.parse_args().reads
    with tempfile.TemporaryDirectory() as tmp:
        read_cost(tmp, reads)
        losses(tmp, reads)


if __name__ == "__main__":
    main()
