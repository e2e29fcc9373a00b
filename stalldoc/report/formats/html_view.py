"""What the HTML page says, as plain records for its template: the verdict, each run's facts,
the findings with their key figures, the launch plan. No HTML here: the template escapes."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from stalldoc.model.findings import SEVERITY_LEVEL
from stalldoc.report.formats.html_timeline import exit_text
from stalldoc.report.formats.text import ending
from stalldoc.report.records import FindingRecord, Report, RunRecord
from stalldoc.report.stack_groups import StackGroup, stack_groups

SHOWN_ELSEWHERE = {"frames", "frame", "culprits", "waiting_at", "phase_stack"}
MAX_FIGURES = 14        # key figures shown per finding (all of them in the JSON below)
MAX_VALUE = 160         # characters of one figure's value


@dataclass(frozen=True)
class Verdict:
    sentence: str
    severity: str          # "critical", "error", "warning", "info" or "ok"
    code: str
    detail: str            # e.g. "no stall was detected"


@dataclass(frozen=True)
class RankRow:
    rank: int
    node: str
    pid: int
    phase: str             # at the last stall, if any
    seen: str              # what the watcher saw at the last stall
    exit: str
    stack: str = "-"       # the stack taken at that stall: "working", "waiting: collective"


@dataclass(frozen=True)
class RunFacts:
    id: str
    node: str
    command: str
    started: str
    duration: str
    ending: str
    ranks: str
    stall_timeout: str
    on_stall: str


@dataclass(frozen=True)
class FindingView:
    code: str
    name: str
    severity: str
    summary: str
    ranks: str
    node: str
    frames: tuple[str, ...]
    figures: tuple[tuple[str, str], ...]
    evidence_json: str
    fix: str
    when: str


@dataclass(frozen=True)
class GroupView:
    group: StackGroup
    culprit: bool          # holds a rank an error finding names (and not every rank of the stall)


@dataclass(frozen=True)
class Plan:
    figures: tuple[tuple[str, str], ...]
    arithmetic: tuple[str, ...]
    resources: tuple[tuple[str, str], ...]
    skipped: tuple[str, ...]


def when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def verdict(report: Report) -> Verdict:
    """The culprit sentence: the first error (a stall's before a launch check's), else the most
    severe finding; "no stall" when nothing was found."""
    found = [f for f in report.findings if f.trigger != "launch"] or list(report.findings)
    severe = [f for f in found if SEVERITY_LEVEL.get(f.severity, 0) >= 2]
    stall_note = "no stall was detected" if not report.stalls else \
        f"{len(report.stalls)} stall(s) detected"
    if severe:
        return Verdict(severe[0].summary, severe[0].severity, severe[0].code, stall_note)
    if found:
        top = max(found, key=lambda f: SEVERITY_LEVEL.get(f.severity, 0))
        return Verdict(top.summary, top.severity, top.code, stall_note)
    if report.stalls:
        return Verdict("Stalled, with no diagnosis: no rank showed work, and no rule matched",
                       "error", "", stall_note)
    return Verdict("No stall: every rank showed work until the run ended", "ok", "", "")


def _seconds(start: float | None, end: float | None) -> str:
    return f"{end - start:.1f} s" if start and end else "-"


def run_facts(run: RunRecord) -> RunFacts:
    info = run.info
    ranks = sorted({r.rank for r in run.ranks})
    return RunFacts(info.id, run.node, " ".join(info.command), when(info.started_at),
                    _seconds(info.started_at, info.ended_at), ending(info),
                    f"{len(ranks)} ({', '.join(map(str, ranks))})" if ranks else "none seen",
                    f"{info.stall_timeout:g} s" if info.stall_timeout else "-",
                    info.on_stall or "-")


def rank_rows(report: Report) -> list[RankRow]:
    """Every rank: where it was at its node's last stall, how it ended."""
    last = {s.node: s for s in report.stalls}
    states = {(g.node, g.stall_id, r): g.state for g in stack_groups(report) for r in g.ranks}
    rows = []
    for r in report.ranks:
        stall = last.get(r.node)
        work = stall.work.get(str(r.rank), {}) if stall else {}
        seen = str(work.get("seen") or "-").replace(", stack not sampled", "")
        rows.append(RankRow(r.rank, r.node, r.pid,
                            (stall.phases.get(str(r.rank)) if stall else "") or "-", seen,
                            exit_text(r) if r.ended_at else "running at the end",
                            states.get((r.node, stall.id, r.rank), "not taken") if stall
                            else "-"))
    return rows


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    elif isinstance(value, float):
        value = f"{value:g}"
    text = str(value)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + "…"


def _flat(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, (str, int, float)) for v in value) and len(value) <= 32
    return isinstance(value, (str, int, float, bool))


def key_figures(evidence: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The evidence's plain values (not the frames, shown apart) as (name, text)."""
    items = [(k.replace("_", " "), _text(v)) for k, v in evidence.items()
             if k not in SHOWN_ELSEWHERE and _flat(v) and v not in ("", None)]
    return tuple(items[:MAX_FIGURES])


def finding_view(f: FindingRecord) -> FindingView:
    return FindingView(f.code, f.name, f.severity, f.summary, ", ".join(map(str, f.ranks)) or "-",
                       f.node, tuple(str(x) for x in f.evidence.get("frames", ())),
                       key_figures(f.evidence),
                       json.dumps(f.evidence, indent=2, sort_keys=True, default=str), f.fix,
                       when(f.t))


def findings(report: Report, launch: bool) -> list[FindingView]:
    """The stall / exit findings (``launch`` False) or the launch checks', most severe first."""
    chosen = [f for f in report.findings if (f.trigger == "launch") == launch]
    chosen.sort(key=lambda f: -SEVERITY_LEVEL.get(f.severity, 0))
    return [finding_view(f) for f in chosen]


# The launch plan's and resources' keys in words; swift's own argument names (num_generations,
# per_device_train_batch_size, ...) stay as the user typed them
LABELS = {"world_size": "ranks (world size)", "global_batch_size": "global batch size",
          "prompts_per_generation": "prompts per generation", "train_prompts": "training prompts",
          "rollouts_per_epoch": "rollouts per epoch", "steps_per_epoch": "steps per epoch",
          "max_steps_given": "max_steps given", "gpus": "GPUs", "gpu_memory": "memory per GPU",
          "dataset_size": "dataset rows", "dataset_note": "dataset size from",
          "model_note": "model from", "versions_note": "framework versions from",
          "not_checked": "not checked",
          "defaults": "swift's defaults used for"}
_GIB = 1 << 30


def _pairs(mapping: Mapping[str, Any], skip: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    return tuple((LABELS.get(k, k), _worded(k, v)) for k, v in mapping.items()
                 if k not in skip and _flat(v))


def _worded(key: str, value: Any) -> str:
    """A value as a person reads it: yes / no, memory in GiB."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "gpu_memory" and isinstance(value, int):
        return f"{value / _GIB:.1f} GiB"
    return _text(value)


def launch_plan(run: RunRecord) -> Plan | None:
    """The GRPO plan stored at launch (``check --format json``'s "plan", alone or with its
    "resources" and "skipped")."""
    stored = run.info.launch
    if not isinstance(stored, Mapping) or not stored:
        return None
    plan = stored.get("plan") if isinstance(stored.get("plan"), Mapping) else stored
    resources = stored.get("resources") if isinstance(stored.get("resources"), Mapping) else {}
    skipped = stored.get("skipped") if isinstance(stored.get("skipped"), list) else []
    arithmetic = plan.get("arithmetic") if isinstance(plan.get("arithmetic"), list) else []
    return Plan(_pairs(plan, ("arithmetic", "plan", "resources", "skipped")),
                tuple(map(str, arithmetic)), _pairs(resources), tuple(map(str, skipped)))


def stack_views(report: Report) -> list[GroupView]:
    """``stack_groups``, each stall's culprit group (ranks an error names) first."""
    blamed = {(f.node, r) for f in report.findings if f.trigger != "launch"
              and SEVERITY_LEVEL.get(f.severity, 0) >= 2 for r in f.ranks}
    groups = stack_groups(report)
    stalls = list(dict.fromkeys((g.node, g.stall_id) for g in groups))
    views = []
    for node, stall_id in stalls:
        mine = [g for g in groups if (g.node, g.stall_id) == (node, stall_id)]
        hits = [any((node, r) in blamed for r in g.ranks) for g in mine]
        partial = any(hits) and not all(hits)
        views += sorted((GroupView(g, partial and hit) for g, hit in zip(mine, hits)),
                        key=lambda v: not v.culprit)
    return views
