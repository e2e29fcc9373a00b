from __future__ import annotations

import dataclasses

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.analysis.rings import (crossed, groups_by_rank, mismatches, missing_ranks,
                                     wrapped_evidence)


def snapshot(rank: int, calls: list[tuple[str, int, str, bool]], group: str = "world"
             ) -> AgentSnapshot:
    ring = tuple(CollectiveRecord(group, n + 1, op, numel, dtype, 1.0, 2.0 if done else None, False)
                 for n, (op, numel, dtype, done) in enumerate(calls))
    done = sum(1 for c in calls if c[3])
    return AgentSnapshot(100 + rank, rank, rank, 4, 0, 0.0, 0.0, 0, 0.0, None, (), "", 0, (),
                         (GroupState(group, len(calls), done, ring),))


def test_rank_behind_and_outside_is_missing_even_with_waiters_at_different_seqs():
    ok = ("broadcast", 4, "float32", True)
    agents = {0: snapshot(0, [ok, ok, ("broadcast", 4, "float32", False)]),   # root ran ahead
              1: snapshot(1, [ok, ("broadcast", 4, "float32", False)]),
              2: snapshot(2, [ok])}                                          # never entered #2
    [gap] = missing_ranks(groups_by_rank(agents), {0, 1, 2})
    assert (gap.seq, gap.op, gap.missing, sorted(gap.waiting)) == (2, "broadcast", (2,), [0, 1])


def test_nobody_waiting_means_nobody_missing():
    ok = ("all_reduce", 4, "float32", True)
    assert missing_ranks(groups_by_rank({0: snapshot(0, [ok]), 1: snapshot(1, [])}), {0, 1}) == []


def test_dead_ranks_are_not_blamed_as_missing():
    agents = {0: snapshot(0, [("all_reduce", 4, "float32", False)]), 1: snapshot(1, [])}
    assert missing_ranks(groups_by_rank(agents), {0}) == []


def test_first_mismatch_per_group():
    agents = {0: snapshot(0, [("all_reduce", 4, "float32", True), ("all_reduce", 8, "float32", False)]),
              1: snapshot(1, [("all_reduce", 4, "float32", True), ("broadcast", 8, "float16", False)])}
    [mismatch] = mismatches(agents)
    assert mismatch.seq == 2
    assert mismatch.calls == {0: ("all_reduce", 8, "float32"), 1: ("broadcast", 8, "float16")}


def test_uneven_all_to_all_splits_are_not_a_mismatch_but_another_op_is():
    """MoE routing sends each rank a different number of tokens: all_to_all_single's input sizes
    differ between ranks by design."""
    agents = {0: snapshot(0, [("all_to_all_single", 96, "bfloat16", False)]),
              1: snapshot(1, [("all_to_all_single", 160, "bfloat16", False)])}
    assert mismatches(agents) == []
    agents[1] = snapshot(1, [("all_reduce", 160, "bfloat16", False)])
    [mismatch] = mismatches(agents)
    assert mismatch.calls == {0: ("all_to_all_single", 96, "bfloat16"),
                              1: ("all_reduce", 160, "bfloat16")}


def _wrapped(agent: AgentSnapshot, count: int) -> AgentSnapshot:
    return dataclasses.replace(agent, groups=(dataclasses.replace(agent.groups[0], wrapped=count),))


def test_collectives_a_ring_overwrote_unread_are_carried_to_the_evidence():
    ok, stuck = ("all_reduce", 4, "float32", True), ("all_reduce", 4, "float32", False)
    agents = {0: _wrapped(snapshot(0, [ok, stuck]), 120), 1: snapshot(1, [ok])}
    [gap] = missing_ranks(groups_by_rank(agents), {0, 1})
    assert (gap.missing, gap.wrapped) == ((1,), {0: 120})
    assert wrapped_evidence(gap.wrapped) == {"wrapped_collectives": {"0": 120}}
    assert wrapped_evidence({}) == {}
    agents[1] = snapshot(1, [ok, ("broadcast", 4, "float32", False)])
    [mismatch] = mismatches(agents)
    assert mismatch.wrapped == {0: 120}


def _in(group: str, calls: list[tuple[str, bool]]) -> GroupState:
    ring = tuple(CollectiveRecord(group, n + 1, op, 4, "float32", 1.0, 2.0 if done else None,
                                  False) for n, (op, done) in enumerate(calls))
    return GroupState(group, len(calls), sum(done for _, done in calls), ring)


def test_ranks_waiting_for_each_other_in_two_groups_are_a_crossed_pair():
    # rank 0 in its TP group's all_reduce (#2) that rank 1 never entered; ranks 1, 2 in the
    # world's all_reduce (#2) that rank 0 never entered; rank 2's TP group has nothing pending
    done = [("all_reduce", True)]
    ranks = {0: (_in("world", done), _in("1", done + [("all_reduce", False)])),
             1: (_in("world", done + [("all_reduce", False)]), _in("1", done)),
             2: (_in("world", done + [("all_reduce", False)]),)}
    gaps = missing_ranks(ranks, {0, 1, 2})
    [(one, other)] = crossed(gaps)
    assert {(g.group, g.missing) for g in (one, other)} == {("world", (0,)), ("1", (1,))}


def test_a_rank_missing_in_its_own_code_is_no_crossed_pair():
    # rank 1 missing from both groups' collectives, waiting in neither: it is the culprit
    done = [("all_reduce", True)]
    ranks = {0: (_in("world", done + [("all_reduce", False)]),
                 _in("1", done + [("all_reduce", False)])),
             1: (_in("world", done), _in("1", done))}
    gaps = missing_ranks(ranks, {0, 1})
    assert len(gaps) == 2 and crossed(gaps) == []
