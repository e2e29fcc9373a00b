"""The HTML report's launch section in words: what ``stalldoc check`` stored for a real GRPO
command line (the plan, the resources, what was not checked) shows no raw key of ours."""
from __future__ import annotations

import re
from types import SimpleNamespace

from stalldoc.report.formats.html_view import launch_plan
from stalldoc.report.records import RunInfo, RunRecord

STORED = {"plan": {"world_size": 8, "per_device_train_batch_size": 2, "num_generations": 8,
                   "steps_per_epoch": None, "max_steps_given": False,
                   "defaults": ["num_iterations"], "arithmetic": ["G = 8 x 2 = 16"]},
          "resources": {"gpus": 8, "gpu_memory": 85899345920, "dataset_size": None,
                        "dataset_note": "the dataset is not on this node", "model_note": ""},
          "skipped": ["the model's size: no config.json"], "not_checked": ["SD409"]}


def run_with(launch: dict) -> RunRecord:
    info = RunInfo(id="r", command=("swift", "rlhf"), node="n", started_at=0.0, ended_at=None,
                   exit_code=None, stall_timeout=45.0, agent=True, schema_version=7,
                   launch=launch)
    return SimpleNamespace(info=info)   # type: ignore[return-value]  (launch_plan reads .info)


def test_our_keys_are_words_and_swifts_arguments_stay_as_typed():
    plan = launch_plan(run_with(STORED))
    assert plan is not None
    shown = dict(plan.figures) | dict(plan.resources)
    assert shown["ranks (world size)"] == "8" and shown["per_device_train_batch_size"] == "2"
    assert shown["max_steps given"] == "no" and shown["memory per GPU"] == "80.0 GiB"
    assert shown["dataset size from"] == "the dataset is not on this node"
    ours = [k for k in shown if re.fullmatch(r"[a-z]+(_[a-z]+)+", k)
            and k not in ("per_device_train_batch_size", "num_generations")]
    assert ours == [], ours
    # a plan stored alone (older runs): what it holds besides the plan is in words too
    alone = launch_plan(run_with({**STORED["plan"], "not_checked": ["SD409"]}))
    assert alone is not None and dict(alone.figures)["not checked"] == "SD409"
