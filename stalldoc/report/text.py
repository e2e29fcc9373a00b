"""The terminal rendering of a report document, and of findings as the watcher prints them."""
from __future__ import annotations

import time
from typing import Any, Iterable

from stalldoc.model import Finding


def _when(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def finding_lines(code: str, severity: str, summary: str, frames: list[str], fix: str) -> list[str]:
    lines = [f"  [{code} {severity}] {summary}"]
    lines += [f"      {frame}" for frame in frames[:8]]
    lines.append(f"      fix: {fix}")
    return lines


def render_findings(findings: Iterable[Finding]) -> str:
    """What the watcher prints when it has a diagnosis."""
    lines = []
    for f in findings:
        lines += finding_lines(f.code, f.severity.value, f.summary,
                               list(f.evidence.get("frames", [])), f.fix)
    return "\n".join(lines)


def render_report(doc: dict[str, Any]) -> str:
    run = doc["run"]
    lines = [f"stalldoc run {run.get('id')} on {run.get('node')}",
             f"  command : {' '.join(run.get('command', []))}",
             f"  started : {_when(run.get('started_at'))}  ended: {_when(run.get('ended_at'))}"
             f"  exit: {run.get('exit_code')}",
             f"  ranks   : {len({r['rank'] for r in doc['ranks']})}", "", "Stalls:"]
    for s in doc["stalls"] or []:
        lines.append(f"  #{s['id']} no progress since {_when(s['started_at'])}, detected "
                     f"{_when(s['detected_at'])} (threshold {s['threshold']:.0f} s), ended "
                     f"{_when(s['ended_at'])}; ranks {s['ranks']}")
    if not doc["stalls"]:
        lines.append("  none")
    lines += ["", "Findings:"]
    for f in doc["findings"]:
        lines += finding_lines(f["code"], f["severity"], f["summary"],
                               f["evidence"].get("frames", []), f["fix"])
    if not doc["findings"]:
        lines.append("  none")
    fallbacks = [s for s in doc["stacks"] if s.get("error")]
    if fallbacks:
        lines += ["", "Stacks not taken by py-spy:"]
        lines += [f"  stall #{s['stall_id']} rank {s['rank']}: {s['method']}; {s['error']}"
                  for s in fallbacks]
    if doc["phases"]:
        lines += ["", "Phases (seconds): name count median p95 max"]
        lines += [f"  {n} {p['count']} {p['median']} {p['p95']} {p['max']}"
                  for n, p in doc["phases"].items()]
    return "\n".join(lines)
