"""``--format markdown``: a block to paste into a GitHub issue, in the shape maintainers' bug
templates ask for (PyTorch, vLLM, DeepSpeed, ms-swift: what happened, the command, the
environment, the logs): the verdict, the command (secrets redacted), the versions recorded at
launch, the findings, one stack per group of ranks in fenced blocks, the launch plan, and which
stalldoc made it. Every part is capped so that the block stays short enough to paste
(``MAX_LINES``); what is cut is counted ("N more").
"""
from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import stalldoc
from stalldoc.model.findings import SEVERITY_LEVEL
from stalldoc.redact import MASK, redact_argv, redact_text
from stalldoc.report.formats.text import ending
from stalldoc.report.records import FindingRecord, Report, RunRecord
from stalldoc.report.stack_groups import StackGroup, stack_groups

MAX_LINES = 150          # the target: the first caps that keep the block within it are used
COMMAND_WIDTH = 96


@dataclass(frozen=True)
class Caps:
    """How much of each part is shown; what is cut is counted."""

    findings: int
    groups: int          # stack groups (of the stall the verdict is about)
    frames: int          # per stack, innermost first
    stalls: int
    command_lines: int
    plan_lines: int
    skipped: int
    nodes: int           # runs listed, distinct commands and plans shown (several nodes)


LEVELS = (Caps(8, 4, 8, 3, 12, 12, 4, 4), Caps(6, 3, 6, 2, 8, 8, 3, 2),
          Caps(4, 2, 5, 1, 4, 4, 2, 1), Caps(2, 1, 4, 1, 2, 2, 1, 1))
VERSION_ROWS = (("python", "Python"), ("torch", "torch"), ("cuda", "CUDA (torch built with)"),
                ("nccl", "NCCL"), ("driver", "NVIDIA driver"), ("vllm", "vLLM"),
                ("deepspeed", "DeepSpeed"), ("transformers", "transformers"), ("trl", "TRL"),
                ("ms-swift", "ms-swift"), ("stalldoc", "stalldoc"))
_SPECIAL = re.compile(r"([\\`*_\[\]<>|#@~])")   # @: no one mentioned, #N: no issue linked


def escape(text: str) -> str:
    """``text`` as literal Markdown inline text: one line, its special characters escaped (a
    frame's ``<module>`` would be taken for an HTML tag)."""
    return _SPECIAL.sub(r"\\\1", " ".join(redact_text(text).split()))


def fenced(lines: Sequence[str], info: str = "text") -> list[str]:
    """A fenced code block whose fence is longer than any run of backticks inside it."""
    runs = [len(m) for line in lines for m in re.findall(r"`+", line)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [fence + info, *(redact_text(line) for line in lines), fence]


def more(count: int, what: str, where: str = "the full report: stalldoc report RUN_DIR") -> str:
    return f"*{count} more {what} in {where}*"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _rank_list(ranks: Iterable[int], limit: int = 16) -> str:
    ranks = sorted(set(ranks))
    text = ",".join(map(str, ranks[:limit]))
    return text + (f",... ({len(ranks)} ranks)" if len(ranks) > limit else "")


def _by_severity(findings: Iterable[FindingRecord]) -> list[FindingRecord]:
    return sorted(findings, key=lambda f: (-SEVERITY_LEVEL.get(f.severity, -1),
                                           f.stall_id is None, f.t))


def verdict(report: Report) -> FindingRecord | None:
    """The finding that says most about what happened: the most severe, a stall's first."""
    ranked = _by_severity(report.findings)
    return ranked[0] if ranked else None


class MarkdownReporter:
    name: ClassVar[str] = "markdown"
    suffix: ClassVar[str] = ".md"

    def render(self, report: Report) -> str:
        """The block with the most detail that fits ``MAX_LINES`` (the last caps whatever)."""
        for caps in LEVELS:
            lines = render_lines(report, caps)
            if len(lines) <= MAX_LINES:
                break
        return "\n".join(lines)


def render_lines(report: Report, caps: Caps) -> list[str]:
    return (summary(report, caps) + command(report, caps) + environment(report)
            + findings(report, caps) + step_shares(report, caps) + stacks(report, caps)
            + launch_plan(report, caps)
            + made_by(report))


def summary(report: Report, caps: Caps) -> list[str]:
    """What happened: the verdict, the stalls, how the run ended."""
    top = verdict(report)
    if top is not None:
        lines = [f"**{escape(top.code)} ({escape(top.severity)}): {escape(top.summary)}**", ""]
    elif report.stalls:
        lines = ["**The job stalled; no rule named a cause.**", ""]
    else:
        lines = ["**No stall was detected and no rule found a problem.**", ""]
    for stall in report.stalls[:caps.stalls]:
        where = f" on {stall.node}" if report.merged else ""
        lines.append(f"- Stall #{stall.id}{where}: no rank showed work since "
                     f"{_when(stall.started_at)}, detected after {stall.threshold:.0f} s; ranks "
                     f"{_rank_list(stall.ranks)}")
    if len(report.stalls) > caps.stalls:
        lines.append(f"- {more(len(report.stalls) - caps.stalls, 'stall(s)')}")
    for run in report.runs[:caps.nodes]:
        where = f" ({escape(run.node)})" if report.merged else ""
        count = len({r.rank for r in run.ranks})
        lines.append(f"- Run {escape(run.info.id)}{where}: {count} rank(s) "
                     f"on {escape(run.info.node)}, started {_when(run.info.started_at)}; "
                     f"{escape(ending(run.info))}")
    if len(report.runs) > caps.nodes:
        lines.append(f"- {more(len(report.runs) - caps.nodes, 'node run(s)')}")
    return ["### What happened (stalldoc)", "", *lines, ""]


def command_lines(argv: Sequence[str], limit: int) -> list[str]:
    """The redacted command, shell-quoted, wrapped before a flag when a line gets long."""
    words = [w if w == MASK else shlex.quote(w) for w in redact_argv(argv)]
    lines: list[str] = []
    current = ""
    for word in words:
        if current and word.startswith("-") and len(current) + len(word) >= COMMAND_WIDTH:
            lines.append(current)
            current = "  " + word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    if len(lines) > limit:
        lines = lines[:limit] + [f"  # ... {len(lines) - limit} more line(s) of arguments"]
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


def command(report: Report, caps: Caps) -> list[str]:
    """The command of each node (the distinct ones, up to ``caps.nodes``)."""
    lines = ["### Command", ""]
    distinct = list(dict.fromkeys(run.info.command for run in report.runs))
    for argv in distinct[:caps.nodes]:
        if report.merged:
            nodes = [escape(run.node) for run in report.runs if run.info.command == argv]
            lines.append(f"On {', '.join(nodes)}:")
        lines += fenced(command_lines(argv, caps.command_lines), "bash") + [""]
    if len(distinct) > caps.nodes:
        lines += [more(len(distinct) - caps.nodes, "node command(s)"), ""]
    return lines


def _distinct_versions(report: Report) -> list[tuple[str, Mapping[str, str]]]:
    """(label, versions) per distinct set of versions among the runs: one column, "version",
    when every node ran with the same; else one per set, labelled with its nodes."""
    nodes: dict[str, list[str]] = {}
    for run in report.runs:
        nodes.setdefault(json.dumps(dict(run.info.versions), sort_keys=True), []).append(run.node)
    if len(nodes) == 1:
        return [("version", json.loads(next(iter(nodes))))]
    return [(", ".join(names), json.loads(key)) for key, names in nodes.items()]


def environment(report: Report) -> list[str]:
    """The versions recorded at launch (a column per node whose versions differ), the GPUs."""
    columns = _distinct_versions(report)
    if not any(v for _, v in columns):
        return ["### Environment", "", "_Not recorded (a run made before stalldoc recorded "
                                       "versions at launch)._", ""]
    header = "| | " + " | ".join(escape(label) for label, _ in columns) + " |"
    lines = ["### Environment", "", header, "|---|" + "---|" * len(columns)]
    for key, name in VERSION_ROWS:
        cells = [escape(versions.get(key) or "-") for _, versions in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    sources = sorted({v.get("source", "") for _, v in columns} - {""})
    lines += ["", f"Versions from {escape('; '.join(sources) or 'an unknown source')} at launch "
                  f"(-: not installed or not known)."]
    return lines + gpus(report.runs) + [""]


def gpus(runs: Sequence[RunRecord]) -> list[str]:
    seen = [(g.name or "GPU", g.memory_total) for run in runs for g in run.gpus]
    if not seen:
        return []
    kinds = sorted(set(seen), key=str)
    text = ", ".join(f"{seen.count(k)} x {escape(k[0])}" + (f" ({k[1] / 2**30:.0f} GiB)"
                                                          if k[1] else "") for k in kinds)
    return [f"GPUs: {text}."]


def findings(report: Report, caps: Caps) -> list[str]:
    ranked = _by_severity(report.findings)
    if not ranked:
        return ["### Findings", "", "None.", ""]
    lines = ["### Findings", ""]
    for f in ranked[:caps.findings]:
        where = f" on {escape(f.node)}" if report.merged else ""
        ranks = f", rank(s) {_rank_list(f.ranks, 8)}" if f.ranks else ""
        lines.append(f"- **{escape(f.code)}** ({escape(f.severity)}, {escape(f.trigger)}"
                     f"{ranks}{where}): {escape(f.summary)}")
        lines.append(f"  Fix: {escape(f.fix)}")
    if len(ranked) > caps.findings:
        lines.append(f"- {more(len(ranked) - caps.findings, 'finding(s)')}")
    return lines + [""]


def step_shares(report: Report, caps: Caps) -> list[str]:
    """Where the ranks' steps went over the run: the kinds of phase of 5 % or more."""
    rows = [(run, s) for run in report.runs for s in run.step_shares if s.over == "run"]
    if not rows:
        return []
    lines = ["#### Where the steps went (share of each cycle)", ""]
    for run, row in rows[:caps.findings]:
        where = f" ({escape(run.node)})" if report.merged else ""
        parts = ", ".join(f"{name} {share:.0%}" for name, share in
                          sorted(row.shares.items(), key=lambda kv: -kv[1]) if share >= 0.05)
        lines.append(f"- rank {row.rank}{where}: {parts} ({row.cycles} cycles of "
                     f"{row.cycle_seconds:.1f} s, {row.cycle} to {row.cycle})")
    if len(rows) > caps.findings:
        lines.append(f"- {more(len(rows) - caps.findings, 'rank(s)')}")
    return lines + [""]


def _shown_stall(report: Report, groups: list[StackGroup]) -> tuple[str, int | None] | None:
    """The stall whose stacks are shown: the verdict's, else the latest with stacks."""
    if not groups:
        return None
    top = verdict(report)
    keys = [(g.node, g.stall_id) for g in groups]
    if top is not None and (top.node, top.stall_id) in keys:
        return top.node, top.stall_id
    return keys[-1]


def stacks(report: Report, caps: Caps) -> list[str]:
    """One stack per group of ranks standing in the same frames (the waiting ranks too)."""
    groups = stack_groups(report)
    shown = _shown_stall(report, groups)
    if shown is None:
        return []
    blamed = set(top.ranks) if (top := verdict(report)) is not None else set()
    mine = sorted((g for g in groups if (g.node, g.stall_id) == shown),
                  key=lambda g: not blamed.intersection(g.ranks))   # the culprits' first
    where = f" on {escape(shown[0])}" if report.merged else ""
    lines = [f"### Stacks at stall #{shown[1]}{where} (main thread, innermost first)", ""]
    for group in mine[:caps.groups]:
        lines += group_lines(group, caps.frames)
    if len(mine) > caps.groups:
        lines += [more(len(mine) - caps.groups, "group(s) of ranks"), ""]
    others = len({(g.node, g.stall_id) for g in groups}) - 1
    if others:
        lines += [more(others, "stall(s) with stacks"), ""]
    return lines


def group_lines(group: StackGroup, limit: int) -> list[str]:
    label = "ranks" if len(group.ranks) > 1 else "rank"
    frame = f" in {escape(str(group.frame))}" if group.frame else ""
    frames = [str(f) for f in group.frames[:limit]]
    if len(group.frames) > limit:
        frames.append(f"... {len(group.frames) - limit} outer frame(s)")
    return [f"{label.capitalize()} {_rank_list(group.ranks)} ({escape(group.state)}){frame}, "
            f"by {escape(group.method)}:", "", *fenced(frames), ""]


def launch_plan(report: Report, caps: Caps) -> list[str]:
    """The GRPO step arithmetic the launch checks worked out, and what they skipped (the
    distinct plans of the nodes, up to ``caps.nodes``)."""
    plans: dict[str, list[str]] = {}
    for run in report.runs:
        launch = run.info.launch or {}
        plans.setdefault(json.dumps(launch, sort_keys=True), []).append(run.node)
    lines: list[str] = []
    for key, nodes in list(plans.items())[:caps.nodes]:
        part = plan_lines(json.loads(key), caps)
        if part and report.merged:
            lines.append(f"On {', '.join(escape(n) for n in nodes)}:")
        lines += part
    if lines and len(plans) > caps.nodes:
        lines += [more(len(plans) - caps.nodes, "node plan(s)"), ""]
    return ["### Launch plan (stalldoc check)", "", *lines] if lines else []


def plan_lines(launch: Mapping[str, Any], caps: Caps) -> list[str]:
    plan = launch.get("plan") or {}
    arithmetic = [str(line) for line in plan.get("arithmetic") or ()]
    skipped = [str(s) for s in launch.get("skipped") or ()]
    if not arithmetic and not skipped:
        return []
    if len(arithmetic) > caps.plan_lines:
        arithmetic = arithmetic[:caps.plan_lines] + [
            f"... {len(arithmetic) - caps.plan_lines} more line(s)"]
    lines = fenced(arithmetic) if arithmetic else []
    lines += [f"- Skipped: {escape(s)}" for s in skipped[:caps.skipped]]
    if len(skipped) > caps.skipped:
        lines.append(f"- {more(len(skipped) - caps.skipped, 'skipped check(s)')}")
    return lines + [""]


def made_by(report: Report) -> list[str]:
    ids = ", ".join(escape(run.info.id) for run in report.runs)
    return [f"<sub>Made by stalldoc {stalldoc.__version__} (`stalldoc report --format markdown`) "
            f"from run {ids}.</sub>"]


REPORTER = MarkdownReporter()
