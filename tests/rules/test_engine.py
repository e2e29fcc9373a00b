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
