"""A finding's lines on a terminal: what the watcher and ``check`` print and the text report
shows (the whole text report is ``stalldoc/report/formats/text.py``)."""
from __future__ import annotations

import textwrap
from typing import Any, Iterable, Mapping

from stalldoc.findings.record import finding_fields
from stalldoc.model.findings import Finding


FIX_WIDTH = 100   # a fix is prose: read in a terminal, a line of it fits this many columns


def record_lines(record: Mapping[str, Any]) -> list[str]:
    """A finding's lines, from its record (``stalldoc.findings.record``): what the watcher
    prints, ``check`` prints and the report shows. The summary stays one line (what a person
    greps for); the fix is prose, wrapped at ``FIX_WIDTH`` columns."""
    frames = list(record["evidence"].get("frames", []))
    lines = [f"  [{record['code']} {record['severity']}] {record['summary']}"]
    lines += [f"      {frame}" for frame in frames[:8]]
    lines += textwrap.wrap(record["fix"], FIX_WIDTH, initial_indent="      fix: ",
                           subsequent_indent=" " * 11, break_long_words=False,
                           break_on_hyphens=False) or ["      fix:"]
    return lines


def render_findings(findings: Iterable[Finding]) -> str:
    """What the watcher prints when it has a diagnosis."""
    return "\n".join(line for f in findings for line in record_lines(finding_fields(f)))
