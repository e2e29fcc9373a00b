"""``stalldoc check``: the launch rules and the GRPO plan of a command, without running it."""
from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

from stalldoc.errors import StalldocError
from stalldoc.launch.config import LaunchConfig, parse_command
from stalldoc.launch.plan import grpo_plan
from stalldoc.launch.resources import Resources, dataset_size, model_info
from stalldoc.model import Finding, GpuSample, Severity, Window
from stalldoc.probes.nvml import NvmlProbe
from stalldoc.rules import run_rules

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?", re.I)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class BadInput(StalldocError):
    exit_code = 2


def parse_size(text: str) -> int:
    """``80G``, ``80GiB``, ``96GB`` (binary units throughout), or bytes."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise BadInput(f"not a memory size: {text!r} (e.g. 80G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _node_gpus() -> list[GpuSample]:
    probe = NvmlProbe()
    if probe.start():
        return []
    try:
        return probe.sample(time.time())
    finally:
        probe.stop()


def launch_window(config: LaunchConfig, seen: list[GpuSample], gpus: int | None = None,
                  gpu_memory: int | None = None, size: int | None = None) -> Window:
    """What the launch rules look at: the command, the GPUs NVML sees (else the user's word),
    the dataset's rows (the user's word, else the local file) and the local model's size."""
    counted, note = (size, "given with --dataset-size") if size is not None else dataset_size(config)
    resources = Resources(len(seen) or gpus,
                          (seen[0].memory_total if seen else None) or gpu_memory, counted, note,
                          model_info(config))
    return Window(time.time(), (), gpus={g.index: (g,) for g in seen}, config=config,
                  resources=resources)


def run_check(argv: list[str], gpus: int | None, gpu_memory: int | None,
              size: int | None) -> tuple[list[Finding], dict[str, Any] | None, Resources]:
    config = parse_command(argv, dict(os.environ))
    if config.error:
        raise BadInput(config.error)
    window = launch_window(config, _node_gpus(), gpus, gpu_memory, size)
    assert window.resources is not None
    plan = grpo_plan(config, window.resources.dataset_size)
    return (run_rules(window, "launch"), dataclasses.asdict(plan) if plan else None,
            window.resources)


def finding_dict(finding: Finding) -> dict[str, Any]:
    """The report's finding shape."""
    return {"code": finding.code, "name": finding.name, "severity": finding.severity.value,
            "ranks": list(finding.ranks), "summary": finding.summary,
            "evidence": dict(finding.evidence), "fix": finding.fix, "trigger": "launch"}


def failed(findings: list[Finding], strict: bool) -> bool:
    bad = {Severity.ERROR, Severity.CRITICAL} | ({Severity.WARNING} if strict else set())
    return any(f.severity in bad for f in findings)
