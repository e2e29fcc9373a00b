"""What the other nodes' summaries mean for this node: the job-wide view the rules see
(``model.ClusterView``) and the evidence of work on other nodes that the stall decision needs
(a node whose ranks only wait is not stalled while a rank elsewhere works)."""
from __future__ import annotations

from stalldoc.model.cluster import PeerNode

WORKING_NOW = 10.0   # a rank published as working this recently works now (a stall ends)


def fresh(peers: tuple[PeerNode, ...]) -> tuple[PeerNode, ...]:
    """The nodes that still speak: not lost, not ended."""
    return tuple(p for p in peers if not p.lost and p.state == "running")


def remote_work_at(peers: tuple[PeerNode, ...], now: float) -> float | None:
    """On our clock, the last time any live rank of a speaking node showed work (None: none
    known). The summary was written before we first read it, so this errs toward recent."""
    times = [now - p.seen_ago - r.work_age for p in fresh(peers) for r in p.ranks
             if not r.dead]
    return max(times) if times else None


def remote_working(peers: tuple[PeerNode, ...]) -> bool:
    """Some rank of a speaking node works now (a stall of the job is over)."""
    return any(r.verdict == "work" and not r.dead and r.work_age + p.seen_ago <= WORKING_NOW
               for p in fresh(peers) for r in p.ranks)

