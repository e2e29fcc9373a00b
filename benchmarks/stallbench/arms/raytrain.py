"""Ray Train's own hang reporting, at its defaults (Ray 2.60, Train V2): the barrier of
``ray.train.report`` and Ray Train's other collectives warns every 60 s
(``RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S``) with the ranks that have not joined it, and the
controller's worker health check marks a worker dead after 600 s without an answer
(``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``; it answers from its own thread, so only a frozen
process misses it). Its NCCL hang detector (``RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR``) polls NCCL's
RAS and cannot watch a gloo group: it does not run here. Read as a user reads the driver's log:
the barrier warning names the missing ranks, with no frame and no cause; the health check's
error names the worker (its rank)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness import Diagnosis, Run, output
from scenario import Scenario

MISSING = re.compile(r"for the following ranks to join the `([^`]+)` call: \[([\d, ]*)\]")
HEALTH = re.compile(r"A worker health check has been hanging")
WORLD_RANK = re.compile(r"world_rank=(\d+)")


@dataclass(frozen=True)
class RayTrain:
    name: str = "raytrain"

    def unavailable(self, scenario: Scenario) -> str:
        return "" if "ray.train" in scenario.needs else \
            "Ray Train watches only the jobs it runs (a TorchTrainer's workers)"

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        return scenario.command(), {}

    def during(self, run: Run) -> None:
        pass

    def read(self, run: Run) -> list[Diagnosis]:
        lines = sorted(output(run, "stdout") + output(run, "stderr"))
        said: list[Diagnosis] = []
        for index, (t, line) in enumerate(lines):
            if match := MISSING.search(line):
                ranks = frozenset(r.strip() for r in match[2].split(",") if r.strip())
                said.append(Diagnosis(t, ranks, "", "", f"raytrain: {line.strip()[:200]}"))
            elif HEALTH.search(line):
                after = " ".join(text for _, text in lines[index:index + 25])
                rank = WORLD_RANK.search(after)
                said.append(Diagnosis(t, frozenset({rank[1]} if rank else set()), "", "",
                                      f"raytrain: {line.strip()[:200]}"))
        return said


ARM = RayTrain()
