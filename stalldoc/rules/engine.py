"""The life of findings from the rules that run every tick.

A tick rule reports what holds now. The book turns that into events: a finding is *opened* the
first tick it appears (stored and printed once), *updated* while it keeps appearing (its evidence
and count refreshed, nothing printed), and *resolved* the first tick it is gone. A finding is the
same finding when its code and ranks are the same. Sticky rules (log signatures: events, not
states) are never resolved by silence; a repeat of one counts up and adds its ranks, and keeps
the evidence of its first occurrence (the first watchdog line is the one that matters): its
first lines, figures and summary, with the later lines counted and the newest one kept apart.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stalldoc.model import Finding

Key = tuple[str, tuple[int, ...]]


@dataclass
class Tracked:
    """A finding that is open: its store row (set once stored) and how often it was seen."""

    finding: Finding
    opened_at: float
    occurrences: int = 1
    sticky: bool = False
    row_id: int | None = None


@dataclass(frozen=True)
class Changes:
    opened: tuple[Tracked, ...] = ()
    updated: tuple[Tracked, ...] = ()
    resolved: tuple[Tracked, ...] = ()


def key_of(finding: Finding, sticky: frozenset[str]) -> Key:
    """The same finding: same code and ranks; for events (sticky codes), the same code."""
    return finding.code, (() if finding.code in sticky else finding.ranks)


@dataclass
class FindingBook:
    open: dict[Key, Tracked] = field(default_factory=dict)

    def update(self, now: float, findings: list[Finding], sticky: frozenset[str],
               resolve: bool = True) -> Changes:
        """Fold in this tick's findings; returns what was opened, updated and resolved (with
        ``resolve`` False, findings absent now stay open: a partial look such as the last one)."""
        current = {key_of(f, sticky): f for f in findings}
        opened, updated = [], []
        for key, finding in current.items():
            tracked = self.open.get(key)
            if tracked is None:
                tracked = self.open[key] = Tracked(finding, now, sticky=finding.code in sticky)
                opened.append(tracked)
            else:
                if tracked.sticky:
                    finding = repeated_event(tracked.finding, finding)
                tracked.finding = finding
                tracked.occurrences += 1
                updated.append(tracked)
        resolved = [t for k, t in self.open.items()
                    if resolve and k not in current and not t.sticky]
        for tracked in resolved:
            del self.open[key_of(tracked.finding, sticky)]
        return Changes(tuple(opened), tuple(updated), tuple(resolved))


EVENT_LINES = 5   # lines of an event kept in its evidence: the first ones


def repeated_event(first: Finding, again: Finding) -> Finding:
    """An event seen again: the ranks it came from add up; the first occurrence's summary,
    figures and lines stay, later lines fill the kept lines up to ``EVENT_LINES`` and are
    counted; the newest line is kept apart as ``last_line``."""
    ranks = tuple(sorted(set(first.ranks) | set(again.ranks)))
    old, new = first.evidence, again.evidence
    evidence = dict(old)
    if old.get("at_shutdown") and not new.get("at_shutdown"):
        evidence.pop("at_shutdown")
    if "lines" in old or "lines" in new:
        lines = list(old.get("lines", ()))
        evidence["lines"] = (lines + list(new.get("lines", ())))[:max(EVENT_LINES, len(lines))]
        evidence["count"] = int(old.get("count", len(lines))) + int(new.get("count", 0))
        if new.get("lines"):
            evidence["last_line"] = new.get("last_line", new["lines"][-1])
            evidence["last_at"] = new.get("last_at", new.get("first_at"))
    return dataclasses.replace(first, ranks=ranks, evidence=evidence)
