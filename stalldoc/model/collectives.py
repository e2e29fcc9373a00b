"""Collectives as the agents' rings and PyTorch's Flight Recorder show them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from stalldoc.model.stacks import Frame


@dataclass(frozen=True)
class FlightEntry:
    """One entry of a rank's PyTorch Flight Recorder: a collective (or p2p op) of a group."""

    group: str                       # the process group's name ("0" for the world)
    group_desc: str                  # "default_pg", or what new_group was given
    seq: int                         # collective_seq_id (p2p_seq_id for p2p ops)
    p2p: bool
    op: str                          # profiling_name, e.g. "gloo:all_reduce", "nccl:all_gather"
    state: str                       # scheduled / started / completed
    retired: bool                    # the work finished (gloo never says "completed")
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    frames: tuple[Frame, ...] = ()   # Python frames where it was issued, innermost first

    @property
    def pending(self) -> bool:
        return not self.retired and self.state != "completed"


@dataclass(frozen=True)
class FlightDump:
    """One rank's Flight Recorder dump, as read from ``<run dir>/flight/rank_<rank>``."""

    rank: int
    path: str
    groups: Mapping[str, tuple[int, ...]]   # group name -> its global ranks (pg_config)
    entries: tuple[FlightEntry, ...]


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective call as a rank saw it."""

    group: str
    seq: int
    op: str
    numel: int
    dtype: str
    entered_at: float
    completed_at: float | None
    is_async: bool

    @property
    def completed(self) -> bool:
        return self.completed_at is not None


@dataclass(frozen=True)
class GroupState:
    """A process group's counters and the newest collectives in it (oldest first)."""

    name: str
    started: int
    completed: int
    ring: tuple[CollectiveRecord, ...]
    # collectives of the group never read: overwritten in the agent's ring before the watcher's
    # next read (counted from its first read of the ring on; 0 for a one-shot read)
    wrapped: int = 0
