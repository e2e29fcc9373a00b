"""What a doctor check found."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

OK, WARNING, PROBLEM, SKIPPED = "ok", "warning", "problem", "skipped"
STATUSES = (OK, WARNING, PROBLEM, SKIPPED)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer: ``status`` is ok, warning (works, with something to
    know), problem (``watch`` will miss something: ``fix`` says what to change) or skipped
    (nothing to check here: ``summary`` says why)."""

    name: str
    status: str
    summary: str
    fix: str = ""
    facts: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "summary": self.summary,
                "fix": self.fix, "facts": dict(self.facts)}
