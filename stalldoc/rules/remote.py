"""The job's ranks on other nodes, for the rules that reason across nodes (multi-node jobs whose
watchers share a run directory): what their node's watcher published of them."""
from __future__ import annotations

from typing import Any

from stalldoc.model.cluster import RemoteRank
from stalldoc.model.window import Window
from stalldoc.rules.base import describe, rank_evidence


def remote_ranks(window: Window) -> dict[int, RemoteRank]:
    """Other nodes' ranks that have not ended (a lost node's as it last published them)."""
    cluster = window.cluster
    if cluster is None or not cluster.shared:
        return {}
    local = {r.rank for r in window.ranks}
    return {r: rr for r, rr in cluster.remote().items() if not rr.dead and r not in local}


def node_tag(window: Window, rank: int) -> str:
    """' (node 1)' for a rank of a multi-node job, '' otherwise."""
    cluster = window.cluster
    if cluster is None:
        return ""
    peer = cluster.node_of(rank)
    return f" ({peer.label if peer else cluster.node})"


def describe_rank(window: Window, rank: int) -> str:
    """Where the rank is, as much as is known: from its stack here, or from its node."""
    remote = remote_ranks(window).get(rank)
    if remote is None:
        return describe(window, rank)
    parts = [f"in {remote.frame}" if remote.frame else "at a frame its node did not publish"]
    if remote.phase:
        parts.append(f"phase {remote.phase}")
    parts.append(f"for {remote.progress_age:.0f} s")
    peer = window.cluster.node_of(rank) if window.cluster else None
    if peer is not None and peer.lost:
        parts.append(f"as {peer.label} last said {peer.seen_ago:.0f} s ago (lost since)")
    return ", ".join(parts)


def evidence_of(window: Window, rank: int) -> dict[str, Any]:
    """``rank_evidence`` for a rank here or on another node (then from its node's summary)."""
    remote = remote_ranks(window).get(rank)
    if remote is None:
        found = rank_evidence(window, rank)
        return {**found, "node": window.cluster.node} if window.cluster else found
    return {"frames": [remote.frame] if remote.frame else [], "frame": remote.frame,
            "phase": remote.phase, "phase_stack": [remote.phase] if remote.phase else [],
            "seconds_without_progress": remote.progress_age, "stack_method": "node summary",
            "node": remote.node}
