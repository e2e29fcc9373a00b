"""Events: findings of sticky rules (log signatures), which say something happened, not that
something holds. An event is the same event whatever ranks print it; a repeat of one counts up
and adds its ranks, and keeps the evidence of its first occurrence (the first watchdog line is
the one that matters): its first lines, figures and summary, with the later lines counted and the
newest one kept apart."""
from __future__ import annotations

import dataclasses

from stalldoc.model.findings import Finding

Key = tuple[str, tuple[int, ...]]
EVENT_LINES = 5   # lines of an event kept in its evidence: the first ones


def key_of(finding: Finding, sticky: frozenset[str]) -> Key:
    """The same finding: same code and ranks; for events (sticky codes), the same code."""
    return finding.code, (() if finding.code in sticky else finding.ranks)


def repeated_event(first: Finding, again: Finding) -> Finding:
    """An event seen again: the ranks it came from add up, and so do the ranks its lines name
    (an evidence list whose key ends in ``_ranks``: the ranks a monitor's lines name, one line
    a rank, lines that may fall in two ticks); the first occurrence's summary, figures and lines
    stay, later lines fill the kept lines up to ``EVENT_LINES`` and are counted; the newest line
    is kept apart as ``last_line``."""
    ranks = tuple(sorted(set(first.ranks) | set(again.ranks)))
    old, new = first.evidence, again.evidence
    evidence = dict(old)
    for key, named in new.items():
        if key.endswith("_ranks") and isinstance(named, list):
            evidence[key] = sorted(set(old.get(key, [])) | set(named))
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


def printed_at_shutdown(finding: Finding, since: float) -> bool:
    """An event made only of lines libraries also print at a normal shutdown (vLLM's "engine
    core died unexpectedly"), first printed at ``since`` or later."""
    evidence = finding.evidence
    return bool(evidence.get("at_shutdown")) and evidence.get("first_at", 0) >= since
