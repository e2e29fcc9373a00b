"""SD113 node-lost."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.cluster import PeerNode
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks


class NodeLost(Rule):
    """Another node of the job stopped publishing its summary (or never published one).

    What it does
        Every node's watcher rewrites a small summary in the shared run directory each tick and
        reads the others'. A node whose summary has not changed for longer than the lost
        threshold (at least 15 s, more with many nodes), or an expected node (``node-0`` ..
        ``node-N-1``) that published nothing two minutes after start, is named with its host,
        its ranks and what they were doing when it last spoke. A node that ended its job is not
        lost. Resolved when it speaks again.

    Why is this bad?
        A silent node is down, cut off (its network, or its mount of the shared filesystem), or
        frozen (stopped processes, a hung kernel); or only its watcher is gone. Its ranks' peers
        wait for them in their next collective until the NCCL timeout, and nothing on the other
        nodes says why.

    Evidence
        node, host, seconds silent, the lost threshold, its ranks and each one's last phase,
        frame and verdict; for a node never seen, its expected name.

    Fix
        Check the node: is it up (``ping``, ``ssh``), are its ranks alive and running (``ps``;
        state ``T`` is stopped), is the shared filesystem mounted there, and did its
        ``stalldoc watch`` start with the same ``--run-dir``. A lost node usually ends in a
        collective timeout on all the others: restart from the last checkpoint without it.

    References
        docs/multi-node.md; NCCL_ASYNC_ERROR_HANDLING / TORCH_NCCL_ASYNC_ERROR_HANDLING.
    """

    code = "SD113"
    name = "node-lost"
    severity = Severity.ERROR
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        cluster = window.cluster
        if cluster is None or not cluster.shared:
            return
        for peer in cluster.lost():
            yield self._lost(peer, cluster.lost_after)
        for name in cluster.never_seen:
            yield self.finding((), f"{name} published no summary in the shared run directory; "
                                   "its node or its watcher did not start (or was given "
                                   "another --run-dir)", {"node": name, "never_seen": True})

    def _lost(self, peer: PeerNode, lost_after: float) -> Finding:
        ranks = [r.rank for r in peer.ranks]
        doing = "; ".join(f"rank {r.rank}: {r.verdict}" + (f" in {r.frame}" if r.frame else "")
                          + (f", phase {r.phase}" if r.phase else "")
                          for r in peer.ranks[:4])
        more = f" (+{len(peer.ranks) - 4} more)" if len(peer.ranks) > 4 else ""
        summary = (f"{peer.label} ({peer.host}, {join_ranks(ranks) if ranks else 'no ranks'}) "
                   f"published nothing for {peer.silent_for:.0f} s: the node is down, cut off, "
                   f"frozen, or its watcher is gone; last seen: {doing or 'no ranks'}{more}")
        return self.finding(ranks, summary, {
            "node": peer.name, "label": peer.label, "host": peer.host,
            "silent_for": peer.silent_for, "lost_after": lost_after,
            "ranks": {str(r.rank): {"phase": r.phase, "frame": r.frame, "verdict": r.verdict,
                                    "pid": r.pid} for r in peer.ranks}})
