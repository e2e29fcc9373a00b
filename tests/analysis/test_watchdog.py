"""A watchdog timeout line matched with the agents' rings: the printing rank's pending entry is
the collective that timed out, whatever the watchdog's own sequence number says."""
from __future__ import annotations

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.analysis.watchdog import align, group_name, op_matches


def snapshot(rank: int, calls: list[tuple[str, bool]], group: str = "world") -> AgentSnapshot:
    ring = tuple(CollectiveRecord(group, n + 1, op, 8, "bfloat16", 1.0, 2.0 if done else None,
                                  False) for n, (op, done) in enumerate(calls))
    done = sum(1 for _, d in calls if d)
    return AgentSnapshot(100 + rank, rank, rank, 6, 0, 0.0, 0.0, 0, 0.0, None, (), "", 0, (),
                         (GroupState(group, len(calls), done, ring),))


DONE = ("all_gather_into_tensor", True)
WAIT = ("all_gather_into_tensor", False)


def test_the_rank_that_never_entered_is_named_by_the_printing_ranks_entry():
    agents = {0: snapshot(0, [DONE] * 130 + [WAIT]), 1: snapshot(1, [DONE] * 130 + [WAIT]),
              2: snapshot(2, [DONE] * 130), 3: snapshot(3, [DONE] * 130 + [WAIT])}
    found = align(1, "_ALLGATHER_BASE", "0", agents, {0, 1, 2, 3})
    assert found is not None and found.seq == 131 and found.op_agrees
    assert (found.waiting, found.missing, found.passed) == ((0, 1, 3), (2,), ())


def test_dead_ranks_and_ranks_without_an_agent_are_not_blamed():
    agents = {0: snapshot(0, [DONE, WAIT]), 2: snapshot(2, [DONE])}
    found = align(0, "ALLGATHER", None, agents, {0, 1})
    assert found is not None and found.missing == () and found.waiting == (0,)
    assert not found.op_agrees     # all_gather_into_tensor does not issue ALLGATHER


def test_another_group_by_its_guid_and_a_rank_that_got_through():
    tp = "3"
    agents = {0: snapshot(0, [("all_reduce", True), ("all_reduce", False)], tp),
              1: snapshot(1, [("all_reduce", True), ("all_reduce", True)], tp),
              2: snapshot(2, [("broadcast", False)])}       # not in the group: not expected
    found = align(0, "ALLREDUCE", tp, agents, {0, 1, 2})
    assert found is not None and found.group == tp
    assert (found.waiting, found.missing, found.passed) == ((0,), (), (1,))


def test_no_alignment_without_a_pending_entry():
    agents = {0: snapshot(0, [DONE]), 1: snapshot(1, [WAIT])}
    assert align(0, "_ALLGATHER_BASE", "default_pg", agents, {0, 1}) is None
    assert align(5, "_ALLGATHER_BASE", "default_pg", agents, {0, 1}) is None


def test_names_and_op_types():
    assert [group_name(g) for g in (None, "0", " default_pg", "7")] == ["world"] * 3 + ["7"]
    assert op_matches("BROADCAST", "broadcast_object_list") and op_matches("COALESCED", "x")
    assert not op_matches("ALLREDUCE", "broadcast") and op_matches("allreduce", "barrier")


def flight(rank: int, last: int, pending: bool, group: str = "0", desc: str = "default_pg"):
    from stalldoc.model.collectives import FlightDump, FlightEntry
    from stalldoc.model.stacks import Frame
    entries = tuple(FlightEntry(group, desc, seq, False, "nccl:all_reduce",
                                "started" if pending and seq == last else "completed",
                                not (pending and seq == last),
                                frames=(Frame("backward", "train.py", 88),))
                    for seq in range(1, last + 1))
    return FlightDump(rank, f"flight/rank_{rank}", {group: (0, 1, 2)}, entries)


def test_the_flight_recorder_matches_seqnum_exactly_where_the_agent_saw_nothing():
    """DDP's reducer issues its all-reduce from C++: no ring entry, but the recorder has it
    under the watchdog's own SeqNum."""
    from stalldoc.analysis.watchdog import align_flight
    dumps = {0: flight(0, 7, True), 1: flight(1, 7, True), 2: flight(2, 6, False)}
    found = align_flight(1, 7, "default_pg", dumps, {0, 1, 2})
    assert found is not None and found.source == "flight_recorder" and found.op == "all_reduce"
    assert (found.seq, found.waiting, found.missing, found.passed) == (7, (0, 1), (2,), ())
    assert [str(f) for f in found.frames] == ["backward (train.py:88)"]
    assert align_flight(1, 8, None, dumps, {0, 1, 2}) is None           # no such entry
    assert align_flight(1, 7, "7", dumps, {0, 1, 2}) is None           # another group's
    tp = {r: flight(r, 3, r != 0, "5", "tp_group") for r in range(3)}
    found = align_flight(2, 3, "tp_group", tp, {1, 2})
    assert found is not None and (found.waiting, found.passed) == ((1, 2), (0,))
