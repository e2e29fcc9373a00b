"""A finding's lines on a terminal: what the watcher and ``check`` print and the text report
shows (the whole text report is ``stalldoc/report/formats/text.py``)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from stalldoc.findings.record import finding_fields
from stalldoc.model.findings import Finding


def record_lines(record: Mapping[str, Any]) -> list[str]:
    """A finding's lines, from its record (``stalldoc.findings.record``): what the watcher
    prints, ``check`` prints and the report shows."""
    frames = list(record["evidence"].get("frames", []))
    lines = [f"  [{record['code']} {record['severity']}] {record['summary']}"]
    lines += [f"      {frame}" for frame in frames[:8]]
    lines.append(f"      fix: {record['fix']}")
    return lines


def render_findings(findings: Iterable[Finding]) -> str:
    """What the watcher prints when it has a diagnosis."""
    return "\n".join(line for f in findings for line in record_lines(finding_fields(f)))
