"""The rule catalogue (one file per rule) and the engine that runs it over a Window."""
from __future__ import annotations

from stalldoc.model import Finding, Window
from stalldoc.rules.base import Rule
from stalldoc.rules.sd101_rank_outside_collective import RankOutsideCollective
from stalldoc.rules.sd102_collective_mismatch import CollectiveMismatch
from stalldoc.rules.sd103_dead_rank import DeadRank
from stalldoc.rules.sd104_python_deadlock import PythonDeadlock
from stalldoc.rules.sd105_stopped_rank import StoppedRank
from stalldoc.rules.sd106_no_progress import NoProgress

RULES: tuple[type[Rule], ...] = (RankOutsideCollective, CollectiveMismatch, DeadRank,
                                 PythonDeadlock, StoppedRank, NoProgress)


def by_code(code: str) -> type[Rule] | None:
    return next((rule for rule in RULES if rule.code == code.upper()), None)


def run_rules(window: Window, trigger: str) -> list[Finding]:
    """Every rule of ``trigger``; fallback rules only when the others found nothing."""
    rules = [rule() for rule in RULES if rule.trigger == trigger]
    findings = [f for rule in rules if not rule.fallback for f in rule.check(window)]
    if not findings:
        findings = [f for rule in rules if rule.fallback for f in rule.check(window)]
    return findings
