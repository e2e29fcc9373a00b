"""SD531 ray-train-group-failed."""
from __future__ import annotations

import re
from typing import Any, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules.log_signature import LogSignature

_DECISION = re.compile(r"\[FailurePolicy\] (?:Decision: FailureDecision\.)?(RETRY|RAISE)\b")
# the exception a failed rank raised, as its snippet's traceback ends; not Ray's own wrapper
_RAISED = re.compile(r"(?:^|\s)((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)"
                     r": .+)")
_RAY_WRAPPERS = ("WorkerGroupError", "TrainingFailedError", "ControllerError")
_LOOK_AHEAD = 60   # lines after a rank's snippet where its exception may end
_RETRY_FIX = ("Ray Train ended the worker group and started a new one from the latest "
              "checkpoint the workers reported (`ray.train.report(metrics, checkpoint=...)`), "
              "else from the beginning: report checkpoints, or a restart redoes the work. A "
              "failure that was no accident (a bad shard, a bug at a given step) comes back in "
              "every attempt until `max_failures` is spent: fix what the rank's traceback "
              "says. Keep `FailureConfig(max_failures=N)` for what does pass (a preempted node, "
              "a lost connection).")
_RAISE_FIX = ("Ray Train gave up: the rank's traceback is the cause, fix it. If the failure was "
              "transient (a preempted node, a lost connection), let Ray Train restart the group "
              "with `RunConfig(failure_config=FailureConfig(max_failures=N))` (0 by default: the "
              "first failure ends the run) and report checkpoints so a restart resumes.")


class RayTrainGroupFailed(LogSignature):
    """Ray Train's worker group failed: which rank, its exception, and whether Ray Train starts it
    again or gives up.

    What it does
        Matches Ray Train's failure policy's decision, ``[FailurePolicy] RETRY`` or ``RAISE``
        with ``Source: worker group`` and ``Error count: N (max allowed: M)`` (Ray 2.5x-2.60,
        printed by its ``TrainController``; before, one line ``[FailurePolicy] Decision:
        FailureDecision.RETRY, Error source: ..., Error count / maximum errors allowed: N/M``),
        and the ``[Rank R Error Snippet]:`` that names the failed world ranks; the exception that
        ends the snippet's traceback is the cause. RETRY is a warning (the run goes on, in new
        processes: its findings from then on say ``attempt 2``); RAISE, an error.

    Why is this bad?
        Ray Train catches the training function's exception inside the worker and ends the
        worker processes itself, as cleanly as a finished run: no process dies of it, no rank
        exits non-zero, and the restarted group trains again from its last checkpoint (or from
        scratch). Without this line the user sees a run that silently redid its first steps, or,
        with ``max_failures`` spent, a driver that failed with a wrapper error.

    Evidence
        the lines; ``decision`` (RETRY, RAISE), ``source`` (worker group, controller,
        preemption), ``errors`` and ``max_failures`` (the count and the limit), ``failed_ranks``,
        ``raised`` (the rank's exception); the ranks that failed.

    Fix
        RETRY: a checkpoint reported through ``ray.train.report`` is where the new group
        resumes; a failure that repeats will spend ``max_failures``, fix its cause. RAISE: the
        rank's exception is the cause; ``FailureConfig(max_failures=N)`` lets Ray Train restart
        the group after transient failures.

    References
        ray-project/ray#59957 (the decision's lines: RETRY or RAISE, its source, the error count
        and the limit), ray-project/ray#60376 (the one-line form, a controller failure retried),
        ray-project/ray#55222 (the ``[Rank R Error Snippet]`` of each failed rank).
    """

    code = "SD531"
    name = "ray-train-group-failed"
    severity = Severity.WARNING
    headline = "Ray Train's worker group failed"
    patterns = (
        r"\[FailurePolicy\] (?:Decision: FailureDecision\.)?(?P<decision>RETRY|RAISE)\b"
        r"(?:, Error source: (?P<source>[\w ]+), Error count / maximum errors allowed: "
        r"(?P<errors>\d+)/(?P<max_failures>\w+))?",
        r"  Source: (?P<source>worker group|controller|preemption)\s*$",
        r"Error count: (?P<errors>\d+) \(max allowed: (?P<max_failures>\w+)\)",
        r"\[Rank (?P<failed_ranks>\d+(?:,\d+)*) Error Snippet\]:",
    )

    def check(self, window: Window) -> Iterator[Finding]:
        for found in super().check(window):
            evidence = dict(found.evidence)
            ranks = [int(r) for r in str(evidence.get("failed_ranks", "")).split(",") if r]
            raised = _raised(window.log)
            if raised:
                evidence["raised"] = raised
            retry = evidence.get("decision") != "RAISE"
            yield self.finding(ranks, _summary(evidence, ranks, retry), evidence,
                               _RETRY_FIX if retry else _RAISE_FIX,
                               Severity.WARNING if retry else Severity.ERROR)


def _summary(evidence: dict[str, Any], ranks: list[int], retry: bool) -> str:
    who = f"rank {', '.join(map(str, ranks))}" if ranks else "a worker"
    what = f" ({who}: {evidence['raised']})" if "raised" in evidence else f" ({who})"
    count = (f", failure {evidence['errors']} of max_failures {evidence['max_failures']}"
             if "errors" in evidence else "")
    then = ("Ray Train ends the group and starts it again, in new processes" if retry
            else "Ray Train gives up, the run fails")
    return f"Ray Train's worker group failed{what}{count}: {then}"


def _raised(lines: tuple[LogLine, ...]) -> str:
    """The exception that ends the first failed rank's snippet ('' when none is printed)."""
    start = next((i for i, line in enumerate(lines) if "Error Snippet]:" in line.text), None)
    if start is None:
        return ""
    for line in lines[start + 1:start + 1 + _LOOK_AHEAD]:
        match = _RAISED.search(line.text)
        if match and not any(w in match.group(1) for w in _RAY_WRAPPERS):
            return match.group(1).strip()[:200]
    return ""
