"""Other nodes of a multi-node job, from the summaries their watchers publish (cluster/)."""
from __future__ import annotations

from dataclasses import dataclass

from stalldoc.model.collectives import GroupState


@dataclass(frozen=True)
class RemoteRank:
    """A rank of another node as its watcher last published it."""

    rank: int
    node: str                       # the node's label: "node 1"
    pid: int
    phase: str
    verdict: str                    # work / pending / idle (detect.work)
    work_age: float                 # seconds since it last showed work, when published
    progress_age: float             # seconds since its counters last moved, when published
    dead: bool
    frame: str                      # its main thread's frame outside libraries ('' unknown)
    stack_kind: str                 # working / waiting kind of that stack ('' unknown)
    groups: tuple[GroupState, ...]  # each group's counters and its pending collective


@dataclass(frozen=True)
class PeerNode:
    """Another node's watcher, as this one last read it."""

    name: str                       # its subdirectory: "node-1"
    label: str                      # "node 1"
    host: str
    state: str                      # running / ended
    silent_for: float               # seconds its summary was seen unchanged, on our clock
    lost: bool                      # silent longer than the cluster's lost_after
    seen_ago: float                 # seconds since we first read its current summary
    stall_id: int | None            # its stall going on, if any
    stall_stacks: bool              # it took its ranks' stacks for that stall
    ranks: tuple[RemoteRank, ...]


@dataclass(frozen=True)
class ClusterView:
    """This node among the job's nodes. ``shared``: the nodes' watchers share a run directory
    (else only the world size says that ranks live elsewhere)."""

    node: str                       # this node's label
    shared: bool
    nnodes: int | None
    world_size: int | None
    peers: tuple[PeerNode, ...] = ()
    never_seen: tuple[str, ...] = ()   # expected nodes that published nothing yet
    lost_after: float = 30.0

    def remote(self) -> dict[int, RemoteRank]:
        """Every other node's ranks by global rank (lost nodes' as last published)."""
        return {r.rank: r for peer in self.peers for r in peer.ranks}

    def lost(self) -> tuple[PeerNode, ...]:
        return tuple(p for p in self.peers if p.lost and p.state != "ended")

    def node_of(self, rank: int) -> PeerNode | None:
        return next((p for p in self.peers if any(r.rank == rank for r in p.ranks)), None)
