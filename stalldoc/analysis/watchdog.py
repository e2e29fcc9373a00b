"""A watchdog timeout line matched with the agents' collective rings.

PyTorch's watchdog names the collective that timed out by the process group's own sequence
number (``SeqNum``) and op type (``OpType=_ALLGATHER_BASE``). The agent numbers the Python calls
it wraps, so the two numbers differ (one ``all_gather_object`` is two c10d collectives; c10d's
internals are not wrapped). What joins them is the rank that printed the line: it waits in
exactly one collective of that group, the pending entry of its ring. Aligned by that entry, the
other ranks' rings say who waits with it and who never entered it.

Where the ranks' Flight Recorder dumps are at hand, the match is exact: the watchdog's SeqNum is
the dump's ``collective_seq_id`` in the same group, for every collective, wrapped or not (DDP's
reducer, c10d internals).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.analysis.flight_recorder import collectives, members, op_name
from stalldoc.model.collectives import FlightDump, FlightEntry
from stalldoc.model.stacks import Frame

# torch's OpType names (c10d Types.hpp) → the Python calls that issue them
_OP_CALLS: dict[str, tuple[str, ...]] = {
    "ALLREDUCE": ("all_reduce", "barrier", "monitored_barrier"),
    "ALLREDUCE_COALESCED": ("all_reduce", "all_reduce_coalesced"),
    "ALLGATHER": ("all_gather", "all_gather_object"),
    "_ALLGATHER_BASE": ("all_gather_into_tensor", "all_gather_single", "_all_gather_base",
                        "all_gather_object"),
    "ALLGATHER_COALESCED": ("all_gather", "all_gather_into_tensor", "all_gather_coalesced"),
    "BROADCAST": ("broadcast", "broadcast_object_list"),
    "REDUCE": ("reduce",),
    "REDUCE_SCATTER": ("reduce_scatter",),
    "_REDUCE_SCATTER_BASE": ("reduce_scatter_tensor", "reduce_scatter_single",
                             "_reduce_scatter_base"),
    "ALLTOALL": ("all_to_all",),
    "ALLTOALL_BASE": ("all_to_all_single",),
    "GATHER": ("gather", "gather_object"),
    "SCATTER": ("scatter", "scatter_object_list"),
    "SEND": ("send", "isend", "batch_isend_irecv", "send_object_list"),
    "RECV": ("recv", "irecv", "batch_isend_irecv", "recv_object_list"),
    "RECVANYSOURCE": ("recv", "irecv"),
    "BARRIER": ("barrier", "monitored_barrier"),
}
_WORLD_NAMES = {"", "0", "default_pg", "world"}


@dataclass(frozen=True)
class WatchdogAlignment:
    """What the rings (or the Flight Recorder) say about the collective rank ``rank``'s watchdog
    timed out in."""

    rank: int
    group: str
    seq: int                           # in the source's numbering (the ring's, or SeqNum)
    op: str                            # the call ('all_gather_into_tensor', 'allreduce')
    op_agrees: bool                    # it can issue the watchdog's OpType
    waiting: tuple[int, ...]           # ranks pending in the same entry (or a later one)
    missing: tuple[int, ...]           # live ranks of the group that never entered it
    passed: tuple[int, ...]            # ranks that completed it (a mismatch)
    source: str = "agent"              # "agent" (rings) or "flight_recorder" (exact)
    frames: tuple[Frame, ...] = ()     # where the printing rank issued it (Flight Recorder)


def group_name(pg: str | None) -> str:
    """The agent's name of the watchdog's process group (its GUID; the default group is
    ``world``)."""
    return "world" if pg is None or pg.strip() in _WORLD_NAMES else pg.strip()


def op_matches(op_type: str | None, call: str) -> bool:
    """Whether Python call ``call`` can issue a work of ``op_type`` (unknown types match)."""
    calls = _OP_CALLS.get((op_type or "").upper())
    return calls is None or call in calls


def align(rank: int, op_type: str | None, pg: str | None,
          agents: Mapping[int, AgentSnapshot], live: set[int]) -> WatchdogAlignment | None:
    """Align the watchdog line of ``rank`` with every rank's ring; None when the printing rank
    has no agent or waits in no collective of that group."""
    name = group_name(pg)
    mine = _group(agents.get(rank), name)
    pending = _pending(mine)
    if pending is None:
        return None
    members = {r for r, a in agents.items() if _group(a, name) is not None}
    # the world group holds every rank with an agent; another group, the ranks that used it
    expected = (set(agents) & live) | members if name == "world" else members
    waiting, missing, passed = [], [], []
    for other in sorted(expected):
        state = _where(_group(agents[other], name), pending.seq)
        if state == "waiting":
            waiting.append(other)
        elif state == "passed":
            passed.append(other)
        elif other in live:
            missing.append(other)
    return WatchdogAlignment(rank, name, pending.seq, pending.op, op_matches(op_type, pending.op),
                             tuple(waiting), tuple(missing), tuple(passed))


def align_flight(rank: int, seq: int, pg: str | None, dumps: Mapping[int, FlightDump],
                 live: set[int]) -> WatchdogAlignment | None:
    """The watchdog's collective ``seq`` found in the printing rank's Flight Recorder dump, and
    where every other dumped rank of the group stands; None without that entry."""
    mine = _flight_entry(dumps.get(rank), pg, seq)
    if mine is None:
        return None
    per_rank = {r: collectives(d).get(mine.group, {}) for r, d in dumps.items()}
    users = {r for r, seqs in per_rank.items() if seqs}
    waiting, missing, passed = [], [], []
    for other in sorted(members(mine.group, mine.group_desc, dumps, users) & set(dumps)):
        seqs = per_rank[other]
        at = seqs.get(seq)
        if at is not None and at.pending:
            waiting.append(other)
        elif at is not None or max(seqs, default=0) > seq:
            passed.append(other)
        elif other in live:
            missing.append(other)
    return WatchdogAlignment(rank, mine.group_desc or mine.group, seq, op_name(mine), True,
                             tuple(waiting), tuple(missing), tuple(passed), "flight_recorder",
                             mine.frames)


def _flight_entry(dump: FlightDump | None, pg: str | None, seq: int) -> FlightEntry | None:
    """The dump's collective ``seq`` of the watchdog's group (the default group when unnamed)."""
    if dump is None:
        return None
    names = {"0", "default_pg"} if group_name(pg) == "world" else {pg}
    return next((e for e in reversed(dump.entries) if not e.p2p and e.seq == seq
                 and (e.group in names or e.group_desc in names)), None)


def _group(agent: AgentSnapshot | None, name: str) -> GroupState | None:
    if agent is None:
        return None
    return next((g for g in agent.groups if g.name == name), None)


def _pending(group: GroupState | None) -> CollectiveRecord | None:
    """The oldest entry of the ring that has not completed (blocking calls: the newest)."""
    if group is None:
        return None
    return next((rec for rec in group.ring if not rec.completed), None)


def _where(group: GroupState | None, seq: int) -> str:
    """'waiting' (in collective ``seq`` or a later one, not through ``seq``), 'passed' (completed
    it) or 'missing' (never entered it)."""
    if group is None or group.started < seq:
        return "missing"
    record = next((rec for rec in group.ring if rec.seq == seq), None)
    if record is None or record.completed:   # completed, or so long ago the ring wrapped past it
        return "passed"
    return "waiting"
