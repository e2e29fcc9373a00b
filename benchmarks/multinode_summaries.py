"""Multi-node watchers on a shared filesystem, simulated: N node summaries (8 ranks each, two
process groups with a pending collective, frames and phases as a GRPO step has them) written by
the real Publisher into one directory, and read back by the real PeerReader, for N = 8, 64, 256
and 1,000 nodes.

Printed per node count: one summary's size; the time to write one (encode and atomic replace);
the time one watcher takes to read its two neighbours and to read every other node; and what the
whole cluster does to the shared filesystem per second, from the read spacing the watchers use
(``cluster/peers.py``): while ranks work (one write per node per tick, neighbour reads), while
every node is quiet (every node reads every other) and during a declared stall. Ratios are against 8 nodes, measured in the
same run. Latency bounds: a change is seen by a neighbour within ``every``, by everyone within
``quiet_every`` once quiet; a silent node is called lost after ``lost_after``.

    python benchmarks/multinode_summaries.py
    python benchmarks/multinode_summaries.py --dir /mnt/lustre/tmp/x   # on a real shared mount
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stalldoc.sidecar.cluster import stalled_every  # noqa: E402
from stalldoc.cluster.publish import Publisher  # noqa: E402
from stalldoc.cluster.summary import encode  # noqa: E402
from stalldoc.model.cluster import RemoteRank
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.cluster.peers import PeerReader  # noqa: E402

RANKS_PER_NODE = 8
INTERVAL = 1.0


def ranks_of(node: int) -> tuple[RemoteRank, ...]:
    out = []
    for local in range(RANKS_PER_NODE):
        rank = node * RANKS_PER_NODE + local
        pending = CollectiveRecord("world", 4242, "all_reduce", 1 << 24, "bfloat16", 0.0, None,
                                   False)
        groups = (GroupState("world", 4242, 4241, (pending,)), GroupState("3", 880, 880, ()))
        out.append(RemoteRank(rank, f"node {node}", 400_000 + rank, "generate", "idle", 12.5,
                              12.5, False,
                              "_fetch_rollouts (/opt/conda/lib/python3.10/site-packages/swift/"
                              "trainers/rlhf_trainer/grpo_trainer.py:1210)",
                              "waiting: collective", groups))
    return tuple(out)


def simulate(base: Path, nodes: int) -> dict[str, float]:
    publishers = []
    for node in range(nodes):
        (base / f"node-{node}").mkdir(mode=0o700)
        publishers.append(Publisher(base / f"node-{node}", f"node-{node}", f"node {node}",
                                    f"gpu-{node:04d}"))
    writes = []
    for node, publisher in enumerate(publishers):
        ranks = ranks_of(node)
        start = time.perf_counter()
        publisher.write(ranks, nodes * RANKS_PER_NODE, (1, True))
        writes.append(time.perf_counter() - start)
    expected = tuple(f"node-{i}" for i in range(nodes))
    reader = PeerReader(base, "node-0", expected, INTERVAL, nodes, 0.0)
    full = []
    for _ in range(3):
        start = time.perf_counter()
        reader.read(time.time())
        full.append(time.perf_counter() - start)
    near = []
    for _ in range(5):
        start = time.perf_counter()
        reader.read_neighbours(time.time())
        near.append(time.perf_counter() - start)
    assert len(reader.peers(time.time())) == nodes - 1, reader.unreadable
    size = len(encode(publishers[0].last)) if publishers[0].last else 0
    working_ops = nodes / INTERVAL + nodes * 2 / reader.every
    quiet_ops = nodes / INTERVAL + nodes * (nodes - 1) / reader.quiet_every
    stalled_ops = nodes / INTERVAL + nodes * 2 / reader.every \
        + nodes * (nodes - 1) / stalled_every(reader.quiet_every)
    return {"nodes": nodes, "bytes": size, "write_ms": statistics.median(writes) * 1e3,
            "near_ms": statistics.median(near) * 1e3, "full_ms": statistics.median(full) * 1e3,
            "every": reader.every, "quiet_every": reader.quiet_every,
            "lost_after": reader.lost_after, "working_ops": working_ops,
            "quiet_ops": quiet_ops, "quiet_mb": quiet_ops * size / 1e6,
            "stalled_ops": stalled_ops,
            "full_mb": (nodes - 1) * size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a shared mount)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 256, 1000])
    args = parser.parse_args()
    rows = []
    for nodes in args.nodes:
        base = Path(tempfile.mkdtemp(prefix=f"stalldoc-nodes-{nodes}-", dir=args.dir))
        try:
            rows.append(simulate(base, nodes))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    first = rows[0]
    print(f"{'nodes':>6} {'summary':>8} {'write':>8} {'read 2':>8} {'read all':>9} "
          f"{'(x base)':>9} {'every':>6} {'quiet':>6} {'lost':>5} {'ops/s work':>11} "
          f"{'ops/s quiet':>12} {'MB/s quiet':>11} {'ops/s stall':>12}")
    for r in rows:
        print(f"{r['nodes']:>6} {r['bytes']:>7}B {r['write_ms']:>6.2f}ms {r['near_ms']:>6.2f}ms "
              f"{r['full_ms']:>7.1f}ms {r['full_ms'] / first['full_ms']:>8.1f}x "
              f"{r['every']:>5.1f}s {r['quiet_every']:>5.1f}s {r['lost_after']:>4.0f}s "
              f"{r['working_ops']:>11.0f} {r['quiet_ops']:>12.0f} {r['quiet_mb']:>11.1f} "
              f"{r['stalled_ops']:>12.0f}")
    print(f"(x base: read-all time against {first['nodes']} nodes; ops/s: file writes and reads "
          "per second by the whole cluster on the shared filesystem)")


if __name__ == "__main__":
    main()
