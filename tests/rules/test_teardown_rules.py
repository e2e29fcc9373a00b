"""SD115 teardown-crash against SD103 dead-rank: a rank killed by a signal after its work was
done (its agent says: past its code at interpreter exit, or inside destroy_process_group; no
exception, no collective pending) is a teardown crash at warning level; anything else that dies
first is a dead rank, critical, as before. The snapshots are shaped as the real agent writes
them at the end of tests/scenarios/teardown_abort.py (see tests/test_teardown_watch.py)."""
from __future__ import annotations

import signal

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.agent.statefile import (STATUS_EXCEPTION, STATUS_EXITED, STATUS_LEFT,
                                      STATUS_RUNNING, STATUS_TEARDOWN)
from stalldoc.model.findings import Severity
from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.model.window import Window
from stalldoc.rules import run_rules

NOW = 1000.0
ABRT, TERM = int(signal.SIGABRT), int(signal.SIGTERM)


def agent(rank: int, status: int, pending: bool = False, error: str = "") -> AgentSnapshot:
    seq = 9
    ring = (CollectiveRecord("world", seq, "barrier", 1, "float32", NOW - 3,
                             None if pending else NOW - 2.9, False),)
    return AgentSnapshot(100 + rank, rank, rank, 2, status, 0.0, NOW - 1, 14, NOW - 1.5, None,
                         (), error, 6, (), (GroupState("world", seq, seq - pending, ring),),
                         c10d_issued=23)


def window(exits: tuple[RankExit, ...], agents: dict[int, AgentSnapshot]) -> Window:
    ranks = tuple(RankProcess(r, 100 + r, r, ("python",)) for r in range(2))
    return Window(NOW, ranks, agents, exits=exits, floor=3.0)


def codes(found) -> list[tuple[str, Severity, tuple[int, ...]]]:
    return [(f.code, f.severity, f.ranks) for f in found if f.code in ("SD103", "SD115")]


def test_sd115_bad_sigabrt_at_interpreter_exit_after_the_work():
    exits = (RankExit(0, 100, NOW, 134, ABRT, "relay"), RankExit(1, 101, NOW + 0.1, 0, None, "proc"))
    found = run_rules(window(exits, {0: agent(0, STATUS_EXITED), 1: agent(1, STATUS_EXITED)}),
                      "exit")
    assert codes(found) == [("SD115", Severity.WARNING, (0,))]
    [crash] = [f for f in found if f.code == "SD115"]
    assert crash.summary.startswith("rank 0 killed by SIGABRT at interpreter exit, after the "
                                    "work was done (rank 0, pid 100: 6 phases and 23 "
                                    "collectives behind it, none pending)")
    assert "pytorch/pytorch issue 190489" in crash.summary and "`os._exit(0)`" in crash.fix
    assert "`import torch._dynamo` before `init_process_group()`" in crash.fix
    assert "destroy_process_group()`: check" not in crash.fix   # it got past it
    assert crash.evidence["ranks"]["0"]["where"] == "interpreter exit"


def test_sd115_bad_inside_destroy_process_group_and_the_launcher_ending_the_others():
    exits = (RankExit(1, 101, NOW, 134, ABRT, "relay"),
             RankExit(0, 100, NOW + 0.5, 143, TERM, "relay"))
    found = run_rules(window(exits, {1: agent(1, STATUS_TEARDOWN), 0: agent(0, STATUS_RUNNING)}),
                      "exit")
    [(code, severity, ranks)] = codes(found)
    assert (code, severity, ranks) == ("SD115", Severity.WARNING, (1,))
    [crash] = [f for f in found if f.code == "SD115"]
    assert "at destroy_process_group" in crash.summary
    assert "crashed inside `destroy_process_group()`: check that what the script does" in crash.fix
    assert "; rank 0 ended after it (SIGTERM);" in crash.summary
    assert crash.evidence["ended_after"] == [0]


def test_sd115_bad_the_launcher_ending_a_rank_already_at_exit_is_not_a_second_crash():
    # torchrun's SIGTERM reached rank 0 while it too was finalizing: named after the crash
    exits = (RankExit(1, 101, NOW, 134, ABRT, "proc"), RankExit(0, 100, NOW + 0.1, 143, TERM, "proc"))
    found = run_rules(window(exits, {0: agent(0, STATUS_EXITED), 1: agent(1, STATUS_EXITED)}),
                      "exit")
    assert codes(found) == [("SD115", Severity.WARNING, (1,))]
    [crash] = [f for f in found if f.code == "SD115"]
    assert "; rank 0 ended after it (SIGTERM, at interpreter exit);" in crash.summary
    assert crash.evidence["ended_after_detail"]["0"]["where"] == "interpreter exit"


def test_sd103_good_for_sd115_still_critical_when_the_work_was_not_done():
    for snapshot in (agent(0, STATUS_RUNNING),                    # killed mid-training
                     agent(0, STATUS_EXITED, pending=True),       # a collective unfinished
                     agent(0, STATUS_EXCEPTION, error="RuntimeError: boom")):
        exits = (RankExit(0, 100, NOW, 134, ABRT, "relay"),)
        assert codes(run_rules(window(exits, {0: snapshot}), "exit")) == [
            ("SD103", Severity.CRITICAL, (0,))], snapshot.status
    # no agent (--no-agent), or the agent of another process (a restarted rank): not known
    exits = (RankExit(0, 555, NOW, 134, ABRT, "relay"),)
    for agents in ({}, {0: agent(0, STATUS_EXITED)}):
        assert codes(run_rules(window(exits, agents), "exit")) == [
            ("SD103", Severity.CRITICAL, (0,))]


def test_sd103_good_a_failure_first_stays_the_culprit_before_a_teardown_crash():
    exits = (RankExit(1, 101, NOW, 1, None, "relay"), RankExit(0, 100, NOW + 1, 134, ABRT, "relay"))
    found = run_rules(window(exits, {0: agent(0, STATUS_EXITED), 1: agent(1, STATUS_RUNNING)}),
                      "exit")
    assert codes(found) == [("SD103", Severity.CRITICAL, (1,))]


def test_an_exit_zero_is_neither():
    exits = (RankExit(0, 100, NOW, 0, None, "relay"),)
    assert codes(run_rules(window(exits, {0: agent(0, STATUS_EXITED)}), "exit")) == []


def test_sd115_bad_a_ray_worker_ended_with_status_1_after_leaving_its_group():
    # verl's workers: each called destroy_process_group() (it returned), then Ray ended the
    # process with status 1 (a C-level _exit, no exit handlers) as the driver shut down
    exits = (RankExit(0, 100, NOW, 1, None, "proc"), RankExit(1, 101, NOW + 0.2, 1, None, "proc"))
    found = run_rules(window(exits, {0: agent(0, STATUS_LEFT), 1: agent(1, STATUS_LEFT)}),
                      "exit")
    assert codes(found) == [("SD115", Severity.WARNING, (0, 1))]
    [left] = [f for f in found if f.code == "SD115"]
    assert left.summary.startswith("ranks 0,1 exited with status 1 after destroy_process_group, "
                                   "after the work was done (rank 0, pid 100: 6 phases and 23 "
                                   "collectives behind it, none pending)"), left.summary
    assert "Ray ends its workers that way" in left.fix and "SIGABRT" not in left.fix
    assert left.evidence["ranks"]["1"] == {**left.evidence["ranks"]["1"], "exit_code": 1,
                                           "signal": None, "where": "after destroy_process_group"}


def test_sd103_good_for_sd115_a_status_without_leaving_the_group_or_by_sys_exit_is_a_death():
    # status 1 while running (training failed), or with the exit handlers run (sys.exit(1),
    # the status the script chose): dead ranks, critical, as before
    for status in (STATUS_RUNNING, STATUS_EXITED, STATUS_TEARDOWN):
        exits = (RankExit(0, 100, NOW, 1, None, "proc"),)
        assert codes(run_rules(window(exits, {0: agent(0, status)}), "exit")) == [
            ("SD103", Severity.CRITICAL, (0,))], status
    # left its group, yet a collective of its rings never completed: not after its work
    exits = (RankExit(0, 100, NOW, 1, None, "proc"),)
    assert codes(run_rules(window(exits, {0: agent(0, STATUS_LEFT, pending=True)}), "exit")) == [
        ("SD103", Severity.CRITICAL, (0,))]
