"""``stalldoc check``'s text: the findings, what could not be checked and why, the GRPO plan with
its letters defined (and which values are swift's defaults), the frameworks the command's
interpreter has, and what ran out of time."""
from __future__ import annotations

from stalldoc.check.preflight import LaunchChecks
from stalldoc.launch.plan import GrpoPlan
from stalldoc.report.text import render_findings


def render_check(checks: LaunchChecks) -> str:
    lines = _findings(checks)
    if checks.unchecked:
        lines += ["not checked (nothing to read):", *(f"  {u}" for u in checks.unchecked)]
    versions = checks.resources.versions
    if versions:
        lines.append(f"frameworks ({checks.resources.versions_note}): "
                     + ", ".join(f"{name} {version}" for name, version in versions.items()))
    if checks.plan:
        lines += plan_lines(checks.plan, checks.resources.dataset_note)
    lines += [f"skipped: {s}" for s in checks.skipped]
    return "\n".join(lines)


def _findings(checks: LaunchChecks) -> list[str]:
    if checks.findings:
        return ["findings:", render_findings(checks.findings)]
    partial = checks.unchecked or checks.skipped
    return ["no findings from the checks that ran" if partial else "no findings"]


def plan_lines(plan: GrpoPlan, dataset_note: str) -> list[str]:
    """The letters (value, and where it comes from), then the arithmetic."""
    lines = ["plan: swift's GRPO step arithmetic (batch sizes count completions, not prompts)"]
    width = [max(len(getattr(s, f)) for s in plan.symbols) for f in ("symbol", "meaning", "value")]
    for s in plan.symbols:
        row = (f"  {s.symbol:<{width[0]}}  {s.meaning:<{width[1]}}  {s.value:>{width[2]}}"
               f"  {s.source}")
        lines.append(row.rstrip())
    lines += [f"  {line}" for line in plan.arithmetic]
    if plan.max_steps is None:
        lines.append(f"  max_steps: unknown ({dataset_note})")
    return lines
