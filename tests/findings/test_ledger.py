"""The ledger: each trigger's findings opened, updated and resolved, one meaning of open."""
from __future__ import annotations

from stalldoc.findings.events import EVENT_LINES
from stalldoc.findings.ledger import OPEN, RESOLVED, Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import SETTLE, STICKY, run_rules


def finding(code: str, ranks: tuple[int, ...], summary: str = "s",
            severity: Severity = Severity.WARNING, **evidence: object) -> Finding:
    return Finding(code, "n", severity, ranks, summary, evidence, "fix")


def test_every_trigger_opens_entries_numbered_in_order():
    ledger = Ledger()
    launch = ledger.launch(1.0, [finding("SD404", (), severity=Severity.ERROR)])
    stall = ledger.stall(2.0, 7, [finding("SD101", (1,)), finding("SD203", (0, 1))])
    exits = ledger.exits(3.0, [finding("SD103", (2,), severity=Severity.CRITICAL)])
    tick = ledger.tick(4.0, [finding("SD108", (0,))])
    opened = launch.opened + stall.opened + exits.opened + tick.opened
    assert [(e.id, e.trigger) for e in opened] == [
        (1, "launch"), (2, "stall"), (3, "stall"), (4, "exit"), (5, "tick")]
    assert [e.stall_id for e in opened] == [None, 7, 7, None, None]
    assert all(e.state == OPEN and e.opened_at == e.updated_at for e in opened)
    assert ledger.opened_counts() == ledger.open_counts() == {
        ("SD404", "error"): 1, ("SD101", "warning"): 1, ("SD203", "warning"): 1,
        ("SD103", "critical"): 1, ("SD108", "warning"): 1}
    assert [e.id for e in ledger.open_entries("stall")] == [2, 3]


def test_a_tick_finding_is_opened_once_updated_while_it_holds_then_resolved():
    ledger = Ledger()
    [first] = ledger.tick(1.0, [finding("SD301", (0,), "a")]).opened
    second = ledger.tick(2.0, [finding("SD301", (0,), "b"), finding("SD301", (1,))])
    assert [e.finding.ranks for e in second.opened] == [(1,)]     # other ranks: another finding
    [held] = second.updated
    assert (held.id, held.finding.summary, held.occurrences) == (first.id, "b", 2)
    assert (held.opened_at, held.updated_at) == (1.0, 2.0)
    [gone] = ledger.tick(3.0, [finding("SD301", (1,))]).resolved
    assert (gone.id, gone.state, gone.resolved_at) == (first.id, RESOLVED, 3.0)
    assert gone.updated_at == 2.0                                  # when it was last seen
    assert ledger.tick(4.0, []).resolved[0].finding.ranks == (1,)
    assert ledger.open_entries() == () and ledger.open_counts() == {}
    assert ledger.opened_counts() == {("SD301", "warning"): 2}
    # the same finding holding again later is a new entry
    [again] = ledger.tick(5.0, [finding("SD301", (0,))]).opened
    assert again.id == 3 and ledger.opened_counts() == {("SD301", "warning"): 3}


def test_a_trend_finding_is_kept_open_for_its_settling_time_after_it_last_held():
    # GIVEN SD208 settling for 120 s, SD301 at once
    ledger = Ledger(settle={"SD208": 120.0})
    [trend] = ledger.tick(1.0, [finding("SD208", (0,)), finding("SD301", (0,))]).opened[:1]
    # WHEN neither holds for a tick: the plain one is resolved, the trend kept open
    assert [e.finding.code for e in ledger.tick(2.0, []).resolved] == ["SD301"]
    # AND the trend holding again within its settling time is the same finding
    assert ledger.tick(60.0, [finding("SD208", (0,))]).updated[0].id == trend.id
    assert ledger.tick(179.0, []).resolved == ()
    # THEN it is resolved once it has not held for 120 s
    [gone] = ledger.tick(180.0, []).resolved
    assert (gone.id, gone.resolved_at, gone.updated_at) == (trend.id, 180.0, 60.0)


def test_cpu_oversubscription_that_dips_for_less_than_its_window_is_one_finding():
    # GIVEN the ledger with the rules' settling times, SD302 open (seen resolved and opened
    # again within one run of two vLLM engines beside training: its run queue dipped)
    ledger = Ledger(settle=SETTLE)
    [open_] = ledger.tick(1.0, [finding("SD302", ())]).opened
    # WHEN it does not hold for 20 s, then holds again
    assert ledger.tick(11.0, []).resolved == () and ledger.tick(21.0, []).resolved == ()
    # THEN it is the same finding; it is resolved once it has not held for its 30 s window
    assert ledger.tick(22.0, [finding("SD302", ())]).updated[0].id == open_.id
    assert ledger.tick(51.0, []).resolved == ()
    [gone] = ledger.tick(52.0, []).resolved
    assert gone.id == open_.id and ledger.opened_counts() == {("SD302", "warning"): 1}


def test_the_last_look_resolves_nothing():
    ledger = Ledger()
    ledger.tick(1.0, [finding("SD301", (0,))])
    assert not ledger.tick(2.0, [], resolve=False)
    assert len(ledger.open_entries("tick")) == 1


def test_events_are_never_resolved_by_silence_and_gather_their_ranks():
    ledger = Ledger(frozenset({"SD506"}))
    ledger.tick(1.0, [finding("SD506", (3,))])
    assert ledger.tick(2.0, []).resolved == ()
    [again] = ledger.tick(3.0, [finding("SD506", (0,))]).updated
    assert again.finding.ranks == (0, 3) and again.occurrences == 2
    assert ledger.tick(4.0, [finding("SD506", (5,))]).opened == ()
    assert ledger.opened_counts() == {("SD506", "warning"): 1}


def _watchdog_line(rank: int, seq: int) -> str:
    return (f"[rank{rank}]:[E1121 14:02:11.123456 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog "
            f"caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before "
            "timing out.")


def test_a_repeated_event_keeps_its_first_lines_and_figures():
    """The first watchdog line names the collective that hung; the lines printed after it (other
    ranks, the teardown) are counted, and only fill the evidence up to its cap."""
    def tick(t: float, *lines: str) -> list[Finding]:
        window = Window(t, (), log=tuple(LogLine(t - 0.5, "stderr", text) for text in lines))
        return [f for f in run_rules(window, "tick") if f.code == "SD501"]

    ledger = Ledger(STICKY)
    first = _watchdog_line(3, 131)
    [opened] = ledger.tick(10.0, tick(10.0, first)).opened
    later = [_watchdog_line(r, 132 + r) for r in range(8)]
    [held] = ledger.tick(11.0, tick(11.0, *later)).updated
    evidence = held.finding.evidence
    assert evidence["lines"][0] == first and evidence["seq"] == "131"
    assert evidence["lines"][1:] == later[:EVENT_LINES - 1]
    assert evidence["count"] == 1 + len(later) and evidence["first_at"] == 9.5
    assert evidence["last_at"] == 10.5 and held.finding.summary == opened.finding.summary
    assert evidence["last_line"] == later[-1]
    assert held.finding.ranks == tuple(range(8)) and held.occurrences == 2


def test_a_monitors_verdicts_in_two_ticks_name_every_rank_they_named():
    """NVRx's rank monitors speak for each rank on its own line, milliseconds apart: a tick may
    fall between them (ft_launcher 0.4.1's lines, as it printed them)."""
    def tick(t: float, line: str) -> list[Finding]:
        window = Window(t, (), log=(LogLine(t - 0.5, "stderr", line),))
        return [f for f in run_rules(window, "tick") if f.code == "SD537"]

    said = ("[2026-11-28 16:07:06,{ms}] [WARNING] [RankMonServer{pid}@vm:{rank}] Did not get "
            "subsequent heartbeat. Waited 8.00 seconds.")
    ledger = Ledger(STICKY)
    ledger.tick(10.0, tick(10.0, said.format(ms=262, pid=15462, rank=0)))
    [held] = ledger.tick(11.0, tick(11.0, said.format(ms=279, pid=15463, rank=1))).updated
    assert held.finding.evidence["monitor_ranks"] == [0, 1]
    assert held.finding.evidence["count"] == 2 and held.occurrences == 2


def test_a_stalls_findings_resolve_when_it_ends_and_only_they():
    ledger = Ledger()
    ledger.launch(0.0, [finding("SD407", ())])
    ledger.stall(1.0, 1, [finding("SD101", (1,)), finding("SD106", (0, 1))])
    ledger.tick(2.0, [finding("SD108", (1,))])
    ended = ledger.stall_ended(5.0, 1)
    assert [(e.finding.code, e.resolved_at) for e in ended.resolved] == [("SD101", 5.0),
                                                                          ("SD106", 5.0)]
    assert not ledger.stall_ended(6.0, 1)
    assert [e.finding.code for e in ledger.open_entries()] == ["SD407", "SD108"]
    [second] = ledger.stall(7.0, 2, [finding("SD101", (1,))]).opened
    assert second.stall_id == 2 and [e.id for e in ledger.open_entries("stall")] == [second.id]


def test_exit_findings_are_made_once_and_later_deaths_update_them_in_place():
    ledger = Ledger()
    [dead] = ledger.exits(1.0, [finding("SD103", (2,), "rank 2 died")]).opened
    assert dead.trigger == "exit"
    assert not ledger.exits(2.0, [finding("SD103", (2,), "rank 2 died")])   # nothing new
    later = ledger.exits(3.0, [finding("SD103", (2,), "rank 2 died; ranks 0, 1 followed"),
                               finding("SD110", (0,))])
    [updated] = later.updated
    assert (updated.id, updated.finding.summary) == (dead.id, "rank 2 died; ranks 0, 1 followed")
    assert (updated.opened_at, updated.updated_at, updated.occurrences) == (1.0, 3.0, 1)
    assert [e.finding.code for e in later.opened] == ["SD110"]
    assert ledger.opened_counts() == {("SD103", "warning"): 1, ("SD110", "warning"): 1}
    assert all(e.is_open for e in ledger.open_entries("exit"))   # dead ranks stay dead



def test_an_exit_the_launcher_restarted_its_ranks_from_is_recovered():
    # GIVEN rank 1 (pid 100) dead, critical, rank 0 still running
    ledger = Ledger()
    dead = finding("SD103", (1,), "rank 1 (pid 100) exited with status 1", Severity.CRITICAL,
                   pid=100)
    [entry] = ledger.exits(1.0, [dead]).opened
    # WHEN rank 1's number is held by no process, or still by the dead one: nothing recovered
    assert not ledger.recovered(2.0, {0: 90}) and not ledger.recovered(2.0, {0: 90, 1: 100})
    # THEN once the launcher started rank 1 again (pid 200), the exit is resolved as recovered
    [recovered] = ledger.recovered(3.0, {0: 91, 1: 200}).resolved
    assert (recovered.id, recovered.state, recovered.resolved_at) == (entry.id, RESOLVED, 3.0)
    assert recovered.finding.evidence["recovered_by"] == {"1": 200}
    assert recovered.finding.summary.endswith("; recovered: the launcher started rank 1 as pid "
                                              "200"), recovered.finding.summary
    assert recovered.finding.severity == Severity.WARNING   # no longer the job's death
    # AND the same failure of the new process is a finding of its own
    again = finding("SD103", (1,), "rank 1 (pid 200) exited with status 1", Severity.CRITICAL,
                    pid=200)
    [second] = ledger.exits(4.0, [again]).opened
    assert second.id != entry.id and second.is_open


def test_findings_once_the_launcher_restarted_the_ranks_say_which_attempt():
    # GIVEN rank 1 dead in the first attempt, a tick finding of that attempt still open
    ledger = Ledger()
    ledger.exits(1.0, [finding("SD103", (1,), "rank 1 (pid 100) exited with status 1",
                               Severity.CRITICAL, pid=100)])
    [first] = ledger.tick(1.5, [finding("SD302", (), "CPU oversubscribed")]).opened
    assert "attempt" not in first.finding.evidence and first.finding.summary == "CPU oversubscribed"
    # WHEN the launcher started the ranks again: the second attempt, from t=2
    assert ledger.begin_attempt(2, 2.0) and not ledger.begin_attempt(2, 2.5)
    [recovered] = ledger.recovered(2.0, {0: 101, 1: 200}).resolved
    # THEN the first attempt's failure is recovered, in attempt 1, by attempt 2's process
    assert recovered.finding.evidence["attempt"] == 1
    assert recovered.finding.summary.endswith("started rank 1 as pid 200 (attempt 2)")
    # AND what the second attempt finds says so: a stall's culprit, an exit, a tick finding
    [culprit] = ledger.stall(3.0, 1, [finding("SD101", (1,), "rank 1 waits in next_batch")]).opened
    [dead] = ledger.exits(4.0, [finding("SD103", (1,), "rank 1 (pid 200) exited with status 1",
                                        Severity.CRITICAL, pid=200)]).opened
    [held] = ledger.tick(5.0, [finding("SD302", (), "CPU oversubscribed")]).updated
    for entry, summary in ((culprit, "rank 1 waits in next_batch"),
                           (dead, "rank 1 (pid 200) exited with status 1"),
                           (held, "CPU oversubscribed")):
        assert entry.finding.summary == f"attempt 2: {summary}"
        assert entry.finding.evidence["attempt"] == 2
    assert held.id == first.id   # the same finding, holding in the new attempt
    # AND a line is in the attempt it was printed in, though read after the next one began
    [line] = ledger.tick(5.0, [finding("SD531", (1,), "worker group failed", first_at=1.9)]
                         ).opened
    assert line.finding.evidence["attempt"] == 1 and line.finding.summary.startswith("attempt 1: ")


def test_an_exit_finding_without_the_dead_pid_is_never_taken_for_recovered():
    ledger = Ledger()
    ledger.exits(1.0, [finding("SD110", (0,), "rank 0 left early")])
    assert not ledger.recovered(2.0, {0: 300})

def test_events_printed_at_a_clean_shutdown_resolve_and_nothing_else():
    ledger = Ledger(frozenset({"SD520"}))
    ledger.stall(10.0, 1, [finding("SD101", (1,), at_shutdown=True, first_at=9.0)])
    ledger.tick(90.0, [finding("SD520", (), at_shutdown=True, first_at=89.0),
                       finding("SD301", (0,))])
    [held, event] = ledger.tick(95.0, [finding("SD301", (0,)), finding(
        "SD520", (), at_shutdown=True, first_at=94.0)]).updated
    assert event.finding.evidence["first_at"] == 89.0      # the first occurrence's
    done = ledger.shutdown(100.0, since=40.0)
    assert [(e.finding.code, e.resolved_at) for e in done.resolved] == [("SD520", 100.0)]
    assert [e.finding.code for e in ledger.open_entries()] == ["SD101", "SD301"]


def test_an_event_printed_long_before_the_end_stays_open():
    ledger = Ledger(frozenset({"SD520"}))
    ledger.tick(10.0, [finding("SD520", (), at_shutdown=True, first_at=9.0)])
    assert not ledger.shutdown(100.0, since=40.0)
    assert ledger.open_counts() == {("SD520", "warning"): 1}


def test_the_end_resolves_a_slow_rank_whose_ranks_progressed_after_it_was_last_seen():
    ledger = Ledger()
    ledger.tick(1.0, [finding("SD108", (0,)), finding("SD108", (1, 2)), finding("SD301", (3,))])
    ledger.tick(2.0, [finding("SD108", (0,)), finding("SD108", (1, 2)), finding("SD301", (3,))])
    # rank 0's phase ended at 2.5 (after the last tick saw it); rank 2 moved only before 2.0,
    # rank 3 (a machine finding, not a progress one) moved too
    changes = ledger.moved_on(3.0, {0: 2.5, 1: 2.6, 2: 1.9, 3: 2.7}, frozenset({"SD108"}))
    [gone] = changes.resolved
    assert (gone.finding.ranks, gone.resolved_at, gone.updated_at) == ((0,), 3.0, 2.0)
    assert sorted(e.finding.ranks for e in ledger.open_entries("tick")) == [(1, 2), (3,)]
    assert not ledger.moved_on(4.0, {}, frozenset({"SD108"}))   # nothing known: nothing moves
