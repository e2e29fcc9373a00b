from __future__ import annotations

from stalldoc.model import Finding, Severity
from stalldoc.rules.engine import FindingBook


def finding(code: str, ranks: tuple[int, ...], summary: str = "s") -> Finding:
    return Finding(code, "n", Severity.WARNING, ranks, summary, {}, "fix")


def test_opened_once_updated_while_it_holds_then_resolved():
    book = FindingBook()
    first = book.update(1.0, [finding("SD301", (0,), "a")], frozenset())
    assert [t.finding.summary for t in first.opened] == ["a"] and not first.updated
    second = book.update(2.0, [finding("SD301", (0,), "b"), finding("SD301", (1,))], frozenset())
    assert [t.finding.ranks for t in second.opened] == [(1,)]      # other ranks: another finding
    [held] = second.updated
    assert (held.finding.summary, held.occurrences, held.opened_at) == ("b", 2, 1.0)
    third = book.update(3.0, [finding("SD301", (1,))], frozenset())
    assert [t.finding.ranks for t in third.resolved] == [(0,)]
    assert book.update(4.0, [], frozenset()).resolved[0].finding.ranks == (1,)
    assert book.open == {}


def test_events_are_never_resolved_by_silence_and_gather_their_ranks():
    book, sticky = FindingBook(), frozenset({"SD506"})
    book.update(1.0, [finding("SD506", (3,))], sticky)
    assert book.update(2.0, [], sticky).resolved == ()
    [again] = book.update(3.0, [finding("SD506", (0,))], sticky).updated
    assert again.finding.ranks == (0, 3) and again.occurrences == 2
    assert book.update(4.0, [finding("SD506", (5,))], sticky).opened == ()


def _watchdog_line(rank: int, seq: int) -> str:
    return (f"[rank{rank}]:[E1121 14:02:11.123456 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog "
            f"caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before "
            "timing out.")


def test_a_repeated_event_keeps_its_first_lines_and_figures():
    """The first watchdog line names the collective that hung; the lines printed after it (other
    ranks, the teardown) are counted, and only fill the evidence up to its cap."""
    from stalldoc.model import LogLine, Window
    from stalldoc.rules import STICKY, run_rules
    from stalldoc.rules.engine import EVENT_LINES

    def tick(t: float, *lines: str) -> list[Finding]:
        window = Window(t, (), log=tuple(LogLine(t - 0.5, "stderr", text) for text in lines))
        return [f for f in run_rules(window, "tick") if f.code == "SD501"]

    book = FindingBook()
    first = _watchdog_line(3, 131)
    [opened] = book.update(10.0, tick(10.0, first), STICKY).opened
    later = [_watchdog_line(r, 132 + r) for r in range(8)]
    [held] = book.update(11.0, tick(11.0, *later), STICKY).updated
    evidence = held.finding.evidence
    assert evidence["lines"][0] == first and evidence["seq"] == "131"
    assert evidence["lines"][1:] == later[:EVENT_LINES - 1]
    assert evidence["count"] == 1 + len(later) and evidence["first_at"] == 9.5
    assert evidence["last_at"] == 10.5 and held.finding.summary == opened.finding.summary
    assert evidence["last_line"] == later[-1]
    assert held.finding.ranks == tuple(range(8)) and held.occurrences == 2
