"""The rule catalogue as ``stalldoc rules`` and ``stalldoc explain`` show it: one row per rule
under a header, columns as wide as their longest value, and a legend for when rules run."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Sequence

from stalldoc.rules.base import Rule

# trigger (the JSON's field) -> (the text column's word, what it means)
WHEN: dict[str, tuple[str, str]] = {
    "launch": ("launch", "before the job starts: stalldoc check, and watch before launching"),
    "tick": ("live", "on every sample while the job runs: its output, GPU and host figures"),
    "stall": ("stall", "when no rank has made progress for the stall timeout"),
    "exit": ("exit", "when a rank ends"),
}
HEADER = ("CODE", "SEVERITY", "RUNS", "NAME", "SUMMARY")
GAP = "  "


@dataclass(frozen=True)
class RuleRow:
    code: str
    name: str
    severity: str
    trigger: str
    summary: str


def summary_of(rule: type[Rule]) -> str:
    """The first paragraph of the rule's docstring, on one line (never cut)."""
    return " ".join(rule.doc().split("\n\n")[0].split())


def rule_rows(rules: Sequence[type[Rule]]) -> list[RuleRow]:
    return [RuleRow(r.code, r.name, r.severity.value, r.trigger, summary_of(r)) for r in rules]


def when(trigger: str) -> str:
    """'on every sample while the job runs: ...' for ``explain``."""
    return WHEN.get(trigger, ("", f"on {trigger}"))[1]


def render_table(rows: Sequence[RuleRow], width: int | None) -> str:
    """A header, one row per rule, then the legend of RUNS. With a ``width`` (a terminal's),
    a long summary wraps under its own column; without, it runs on (one line per rule, for
    grep)."""
    cells = [HEADER] + [(r.code, r.severity, WHEN.get(r.trigger, (r.trigger,))[0], r.name, "")
                        for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER) - 1)]
    indent = sum(widths) + len(GAP) * len(widths)
    summaries = [HEADER[-1]] + [r.summary for r in rows]
    lines = []
    for row, summary in zip(cells, summaries):
        head = GAP.join(cell.ljust(w) for cell, w in zip(row, widths)) + GAP
        lines.append(head + _wrapped(summary, indent, width))
    legend = [f"  {word:<{max(len(w) for w, _ in WHEN.values())}}  {meaning}"
              for word, meaning in WHEN.values()]
    return "\n".join([*lines, "", "RUNS:", *legend])


def _wrapped(summary: str, indent: int, width: int | None) -> str:
    room = (width or 0) - indent
    if width is None or room < 30:      # no terminal, or too narrow to wrap usefully
        return summary
    return ("\n" + " " * indent).join(textwrap.wrap(summary, room, break_on_hyphens=False))
