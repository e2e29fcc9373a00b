"""nvidia-resiliency-ext's rank monitors, as its usage guide sets them up: ``ft_launcher`` in
place of torchrun, a heartbeat after every step (jobkit.step: ``RankMonitorClient.
init_workload_monitoring()`` then ``send_heartbeat()``), no restarts. The heartbeat timeout is
45 s, stalldoc's default stall timeout, so that both speak after the same quiet time (NVRx's own
default, 45 min, would make every run most of an hour); the initial one 120 s, for start-up.
Read as a user reads the launcher's log: the ranks whose monitors report a missing heartbeat
within one check of each other are named together; no frame, no cause."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import Diagnosis, Run, output
from scenario import Scenario

LAUNCHER = str(Path(sys.executable).with_name("ft_launcher"))
VERDICT = re.compile(r"\[RankMonServer\d+@[^:\]]+:(\d+)\] (Did not get (?:initial|subsequent) "
                     r"heartbeat|Section '.*' has been open|Was out of section)")
TOGETHER = 2.0   # seconds: monitors that fire within one check of each other (interval 1 s)


@dataclass(frozen=True)
class Nvrx:
    name: str = "nvrx"
    heartbeat_timeout: float = 45.0

    def unavailable(self, scenario: Scenario) -> str:
        if not Path(LAUNCHER).exists():
            return "nvidia-resiliency-ext is not installed"
        return "" if scenario.launch.startswith("torchrun") else \
            "ft_launcher replaces torchrun only"

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        count = scenario.launch.split()[1]
        return ([LAUNCHER, "--standalone", "--nnodes=1", f"--nproc-per-node={count}",
                 "--max-restarts=0", "--ft-initial-rank-heartbeat-timeout=120",
                 f"--ft-rank-heartbeat-timeout={self.heartbeat_timeout:g}",
                 "--ft-workload-check-interval=1", "--ft-enable-nic-monitor=false",
                 str(scenario.path)], {"STALLBENCH_NVRX": "1"})

    def during(self, run: Run) -> None:
        pass

    def read(self, run: Run) -> list[Diagnosis]:
        fired = [(t, m[1], line.strip()) for t, line in output(run) if (m := VERDICT.search(line))]
        said: list[Diagnosis] = []
        for t, rank, line in fired:
            if said and t - said[-1].t <= TOGETHER:
                last = said[-1]
                said[-1] = Diagnosis(last.t, last.culprits | {rank}, "", "", last.text)
            else:
                said.append(Diagnosis(t, frozenset({rank}), "", "", f"nvrx: {line[:200]}"))
        return said


ARM = Nvrx()
