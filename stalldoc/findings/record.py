"""The one serialized shape of a finding: plain JSON values, in one order.

``finding_fields``: what the finding says (code, name, severity, ranks, summary, evidence, fix),
enough to print it. ``finding_record``: those and its trigger (``check --format json``), and the
life of a ledger entry when given (``entry_record``: id, t, stall_id, updated_at, resolved_at,
occurrences, state), which the store writes as its row.
"""
from __future__ import annotations

import json
from typing import Any

from stalldoc.findings.ledger import Entry
from stalldoc.model.findings import Finding


def finding_fields(finding: Finding) -> dict[str, Any]:
    """What the finding says; its evidence as JSON values (what JSON cannot hold as text)."""
    return {"code": finding.code, "name": finding.name, "severity": finding.severity.value,
            "ranks": list(finding.ranks), "summary": finding.summary,
            "evidence": plain(dict(finding.evidence)), "fix": finding.fix}


def finding_record(finding: Finding, trigger: str, **life: Any) -> dict[str, Any]:
    """The finding, the moment that made it and, in ``life``, what the ledger knows of it."""
    return {**finding_fields(finding), "trigger": trigger, **life}


def entry_record(entry: Entry) -> dict[str, Any]:
    """A ledger entry: its finding and its life (``t`` is when it was opened)."""
    return finding_record(entry.finding, entry.trigger, id=entry.id, t=entry.opened_at,
                          stall_id=entry.stall_id, updated_at=entry.updated_at,
                          resolved_at=entry.resolved_at, occurrences=entry.occurrences,
                          state=entry.state)


def plain(value: Any) -> Any:
    """``value`` as JSON would give it back: tuples as lists, keys as text, other objects as
    their text."""
    return json.loads(json.dumps(value, default=str))
