"""What the HTML page says: the verdict (culprit first, launch errors after stall errors, "no
stall"), key figures of a finding, and the launch plan in either stored shape."""
from __future__ import annotations

from dataclasses import replace

from support import run_record as _run
from stalldoc.report.formats.html_view import key_figures, launch_plan, verdict
from stalldoc.report.records import FindingRecord, Report

T0 = 1_700_000_000.0
PLAN = {"world_size": 8, "max_steps": 1320, "arithmetic": ["max_steps = ceil(3*440) = 1320"]}


def _finding(code: str, severity: str, summary: str, trigger: str = "stall",
             t: float = T0) -> FindingRecord:
    return FindingRecord(1, t, None, code, "name", severity, (1,), summary, {}, "fix", trigger)


def test_the_verdict_is_the_first_stall_error_then_the_most_severe_then_no_stall():
    def of(*findings: FindingRecord) -> str:
        return verdict(Report((_run(findings=findings),))).sentence
    launch = _finding("SD406", "error", "bad batch", "launch")
    slow = _finding("SD108", "warning", "rank 0 is slow")
    assert of(launch, _finding("SD101", "error", "rank 1 not in all_reduce", t=T0 + 9),
              _finding("SD102", "error", "later", t=T0 + 10)) == "rank 1 not in all_reduce"
    assert of(launch, slow) == "rank 0 is slow"
    assert of(launch) == "bad batch"
    assert of(_finding("SD900", "info", "fyi"), slow) == "rank 0 is slow"
    quiet = verdict(Report((_run(),)))
    assert quiet.severity == "ok" and quiet.sentence.startswith("No stall")


def test_key_figures_leave_the_frames_to_their_own_block():
    figures = dict(key_figures({"frames": ["a (b.py:1)"], "seq": 7, "op": "all_reduce",
                                "waiting_ranks": [0, 2], "culprits": {"1": {}}, "ratio": 0.125,
                                "empty": ""}))
    assert figures == {"seq": "7", "op": "all_reduce", "waiting ranks": "0, 2", "ratio": "0.125"}


def test_the_launch_plan_alone_or_with_its_resources():
    def plan_of(stored: object):
        run = _run()
        return launch_plan(replace(run, info=replace(run.info, launch=stored)))
    alone = plan_of(PLAN)
    assert ("max_steps", "1320") in alone.figures and alone.arithmetic == tuple(PLAN["arithmetic"])
    whole = plan_of({"plan": PLAN, "resources": {"gpus": 8}, "skipped": ["model not local"]})
    assert whole.figures == alone.figures and whole.resources == (("GPUs", "8"),)
    assert whole.skipped == ("model not local",)
    assert plan_of(None) is None and plan_of({}) is None
