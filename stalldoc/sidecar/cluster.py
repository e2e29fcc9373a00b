"""This watcher as one node of a multi-node job: publish our summary, read the other nodes', and
give the stall decision and the rules the job-wide view (``model.ClusterView``).

With a shared run directory every node's watcher sees every rank's collectives, phase and frame.
Without one (``--run-dir`` not given, or not the same path everywhere) the view still knows the
world size from the agents, so a node can say which global ranks its ranks wait for.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

from stalldoc.cluster.peers import PeerReader
from stalldoc.cluster.publish import LocalView, Publisher, local_ranks
from stalldoc.cluster.view import fresh, remote_work_at, remote_working
from stalldoc.run.nodes import NodeIdentity
from stalldoc.run.options import WatchOptions
from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.cluster import ClusterView, PeerNode

DISCOVER = 60.0        # seconds between listings of nodes named by host (no node ranks)
STALLED_EVERY = 30.0   # seconds between reads of every node during a stall (at least)


def stalled_every(quiet_every: float) -> float:
    """During a stall every node is read ten times less often than while quiet (30 s up to
    ~100 nodes, 300 s at 1,000): a rank working again ends the stall on its own node anyway."""
    return max(STALLED_EVERY, 10 * quiet_every)
POLL = 0.5             # seconds between reads while waiting for the other nodes' stacks


class NodeCluster:
    def __init__(self, opts: WatchOptions, run_dir: Path, host: str, started_at: float) -> None:
        identity = NodeIdentity(opts.node, opts.node_index, opts.nnodes)
        self.label = identity.label if opts.node else "this node"
        self.nnodes = opts.nnodes
        self.shared = opts.shared_dir
        self.publisher = Publisher(run_dir, opts.node, self.label, host) if self.shared else None
        expected = tuple(f"node-{i}" for i in range(opts.nnodes or 0)) \
            if opts.node_index is not None else ()
        self.reader = (PeerReader(self.shared, opts.node, expected, opts.interval, opts.nnodes,
                                  started_at) if self.shared else None)
        self.world_size: int | None = None

    # ----- reading ----------------------------------------------------------------------------
    def refresh(self, now: float, quiet_for: float, threshold: float, stalled: bool) -> None:
        """Read the other nodes when due. While this node's ranks work: only the neighbours
        (are they still speaking?). While they have shown no work for half the threshold:
        every node (is any rank of the job working?), spaced out with the node count. In a
        stall: every node now and then (a rank elsewhere working again ends it)."""
        reader = self.reader
        if reader is None:
            return
        quiet = quiet_for > threshold / 2
        if not reader.expected and reader.due(now, full=True) \
                and now - reader.full_read_at >= DISCOVER:
            reader.read(now)      # nodes named by host: find who is there
        elif quiet and not stalled and reader.due(now, full=True):
            reader.read(now)
        elif stalled and now - reader.full_read_at >= stalled_every(reader.quiet_every):
            reader.read(now)
        elif reader.due(now, full=False):
            reader.read_neighbours(now)

    def peers(self, now: float) -> tuple[PeerNode, ...]:
        return self.reader.peers(now) if self.reader is not None else ()

    def elsewhere(self, now: float) -> tuple[float | None, bool]:
        """(the last work on another node, whether a rank there works now)."""
        peers = self.peers(now)
        return remote_work_at(peers, now), remote_working(peers)

    def view(self, now: float, agents: Mapping[int, AgentSnapshot], local: int
             ) -> ClusterView | None:
        """The job-wide view for the rules; None for a job on one node."""
        self._learn_world(agents)
        peers = self.peers(now)
        if not self.shared and (self.world_size or 0) <= local:
            return None
        reader = self.reader
        return ClusterView(self.label, self.shared is not None, self.nnodes, self.world_size,
                           peers, reader.never_seen(now) if reader else (),
                           reader.lost_after if reader else 0.0)

    def _learn_world(self, agents: Mapping[int, AgentSnapshot]) -> None:
        sizes = [a.world_size for a in agents.values() if a.world_size > 0]
        published = self.reader.world_size() if self.reader is not None else None
        if published:
            sizes.append(published)
        if sizes:
            self.world_size = max(sizes)

    def await_stacks(self, timeout: float) -> None:
        """After this node's stall stacks: wait (at most ``timeout``) until every speaking
        node has published its own, so the diagnosis can name a culprit's frame there."""
        if self.reader is None:
            return
        deadline = time.time() + timeout
        while True:
            now = time.time()
            self.reader.read(now)
            waiting = [p for p in fresh(self.reader.peers(now)) if not p.stall_stacks]
            if not waiting or now >= deadline:
                return
            if self.publisher is not None:
                self.publisher.again()
            time.sleep(POLL)

    def wait_limit(self) -> float:
        """How long a diagnosis waits for the other nodes' stacks."""
        return min(30.0, max(10.0, 2 * self.reader.every)) if self.reader else 0.0

    # ----- writing ----------------------------------------------------------------------------
    def publish(self, local: LocalView, stall: tuple[int, bool] | None,
                ended: bool = False) -> None:
        if self.publisher is None:
            return
        self._learn_world(local.agents)
        self.publisher.write(local_ranks(self.label, local), self.world_size, stall, ended)
