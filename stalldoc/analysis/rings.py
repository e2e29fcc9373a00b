"""Align the collective rings of all ranks: who waits in which collective, who never entered it,
and where ranks disagree on what collective number N is."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord
from stalldoc.model.collectives import GroupState


@dataclass(frozen=True)
class MissingFromCollective:
    """Ranks ``waiting`` sit in collective ``seq`` of ``group``; ranks ``missing`` never entered it."""

    group: str
    seq: int
    op: str
    waiting: dict[int, CollectiveRecord]
    missing: tuple[int, ...]
    wrapped: dict[int, int] = field(default_factory=dict)   # rank -> collectives never read


@dataclass(frozen=True)
class Mismatch:
    """Ranks disagree on collective ``seq`` of ``group``: rank → (op, numel, dtype)."""

    group: str
    seq: int
    calls: dict[int, tuple[str, int, str]]
    wrapped: dict[int, int] = field(default_factory=dict)   # rank -> collectives never read


def _by_group(agents: Mapping[int, AgentSnapshot]) -> dict[str, dict[int, AgentSnapshot]]:
    groups: dict[str, dict[int, AgentSnapshot]] = {}
    for rank, agent in agents.items():
        for group in agent.groups:
            groups.setdefault(group.name, {})[rank] = agent
    return groups


def wrapped_of(groups: Mapping[int, GroupState]) -> dict[int, int]:
    """Rank → how many collectives of its group the watcher never read (its ring overwrote
    them between two reads), for the ranks where that happened."""
    return {rank: group.wrapped for rank, group in sorted(groups.items()) if group.wrapped}


def wrapped_evidence(wrapped: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """A finding's ``wrapped_collectives`` evidence (rank → collectives never read); nothing
    when every collective was read."""
    return {"wrapped_collectives": {str(r): n for r, n in sorted(wrapped.items())}} if wrapped \
        else {}


def groups_by_rank(agents: Mapping[int, AgentSnapshot]) -> dict[int, Sequence[GroupState]]:
    """Each rank's process groups, as its agent last wrote them."""
    return {rank: agent.groups for rank, agent in agents.items()}


def missing_ranks(ranks: Mapping[int, Sequence[GroupState]], live: set[int]
                  ) -> list[MissingFromCollective]:
    """For each group with a pending collective: which live ranks are in no collective of it.

    ``ranks``: each rank's groups, from its agent or (another node's ranks) from the summary
    its node's watcher published. Ranks inside a collective of the group are waiters, even at
    different sequence numbers (a broadcast root can run one call ahead); a rank of the group
    that is in none and has not reached the oldest pending one is missing. The world group
    holds every live rank; another group holds the ranks that used it so far.
    """
    out = []
    members_of: dict[str, dict[int, GroupState]] = {}
    for rank, groups in ranks.items():
        for group in groups:
            members_of.setdefault(group.name, {})[rank] = group
    for name, members in members_of.items():
        expected = live if name == "world" else set(members) & live
        waiting: dict[int, CollectiveRecord] = {}
        started: dict[int, int] = {}
        for rank, group in members.items():
            started[rank] = group.started
            if rank in live and group.ring and not group.ring[-1].completed:
                waiting[rank] = group.ring[-1]
        if not waiting:
            continue
        first = min(waiting.values(), key=lambda rec: rec.seq)
        missing = tuple(sorted(r for r in expected - set(waiting)
                               if started.get(r, 0) < first.seq))
        if missing:
            out.append(MissingFromCollective(name, first.seq, first.op, waiting, missing,
                                             wrapped_of(members)))
    return out


def left_early(agents: Mapping[int, AgentSnapshot], live: set[int], gone: set[int]
               ) -> list[MissingFromCollective]:
    """For each group whose live ranks wait in a collective: the ranks that have ended without
    reaching it (``missing``). The world group holds every rank; another group holds the ranks
    that used it."""
    out = []
    for name, members in _by_group(agents).items():
        groups = {r: next(g for g in a.groups if g.name == name) for r, a in members.items()}
        waiting = {r: g.ring[-1] for r, g in groups.items()
                   if r in live and g.ring and not g.ring[-1].completed}
        if not waiting:
            continue
        first = min(waiting.values(), key=lambda rec: rec.seq)
        expected = gone if name == "world" else set(members) & gone
        missing = tuple(sorted(r for r in expected
                               if (groups[r].started if r in groups else 0) < first.seq))
        if missing:
            out.append(MissingFromCollective(name, first.seq, first.op, waiting, missing,
                                             wrapped_of(groups)))
    return out


# calls whose input legitimately differs in size between ranks: all_to_all with uneven splits
# (MoE token routing), point-to-point transfers
UNEVEN_OPS = frozenset({"all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
                        "batch_isend_irecv", "send_object_list", "recv_object_list"})


def _comparable(rec: CollectiveRecord) -> tuple[str, int, str]:
    """What ranks must agree on: op, dtype, and the element count unless the op is uneven."""
    return rec.op, (-1 if rec.op in UNEVEN_OPS else rec.numel), rec.dtype


def mismatches(agents: Mapping[int, AgentSnapshot]) -> list[Mismatch]:
    """The first collective of each group where ranks' op, size or dtype differ (sizes only
    where ranks must agree on them)."""
    out = []
    for name, members in _by_group(agents).items():
        calls: dict[int, dict[int, CollectiveRecord]] = {}
        groups = {r: next(g for g in a.groups if g.name == name) for r, a in members.items()}
        for rank, group in groups.items():
            for rec in group.ring:
                calls.setdefault(rec.seq, {})[rank] = rec
        for seq in sorted(calls):
            seen = calls[seq]
            if len(seen) > 1 and len({_comparable(rec) for rec in seen.values()}) > 1:
                out.append(Mismatch(name, seq, {r: (rec.op, rec.numel, rec.dtype)
                                                for r, rec in sorted(seen.items())},
                                    wrapped_of(groups)))
                break
    return out


def crossed(gaps: Sequence[MissingFromCollective]
            ) -> list[tuple[MissingFromCollective, MissingFromCollective]]:
    """Pairs of gaps of two groups whose ranks wait for each other: the ranks missing from
    one group's collective all wait in the other's, which the first's waiting ranks never
    entered. Neither side is stuck in its own code: the ranks issue the two groups'
    collectives in different orders (a colocated engine's TP group and the world, say)."""
    out = []
    for i, one in enumerate(gaps):
        for other in gaps[i + 1:]:
            if one.group != other.group and set(one.missing) <= set(other.waiting) \
                    and set(other.missing) <= set(one.waiting):
                out.append((one, other))
    return out
