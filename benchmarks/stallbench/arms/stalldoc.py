"""stalldoc: ``stalldoc watch`` around the launch command, at its defaults (observe, stall
timeout 45 s) or at a short stall timeout; read from ``stalldoc report --format json`` (the same
findings its stderr prints while the job runs, with their times)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import Diagnosis, Run, output
from scenario import Scenario

# a finding's code -> the cause kind it names (the scenarios' vocabulary)
CAUSES = {
    "SD101": "rank_outside_collective", "SD102": "collective_mismatch",
    "SD529": "collective_mismatch", "SD541": "collective_mismatch",
    "SD103": "dead_rank", "SD110": "dead_rank", "SD543": "dead_rank", "SD113": "dead_rank",
    "SD104": "python_deadlock", "SD105": "stopped_rank",
    "SD107": "waiting_on_server", "SD111": "waiting_on_server", "SD120": "waiting_on_server",
    "SD507": "waiting_on_server", "SD525": "waiting_on_server", "SD526": "waiting_on_server",
    "SD112": "engine_asleep",
    "SD117": "engine_dead", "SD122": "engine_dead", "SD520": "engine_dead",
    "SD532": "engine_dead", "SD538": "engine_dead",
    "SD534": "unschedulable", "SD114": "rendezvous_missing_node",
    "SD515": "rendezvous_missing_node", "SD514": "rendezvous_missing_node",
    "SD109": "livelock_spin", "SD121": "cpu_busy",
}


@dataclass(frozen=True)
class Stalldoc:
    name: str
    stall_timeout: float | None = None

    def unavailable(self, scenario: Scenario) -> str:
        return ""

    def command(self, scenario: Scenario, folder: Path) -> tuple[list[str], dict[str, str]]:
        timeout = [] if self.stall_timeout is None else ["--stall-timeout",
                                                         str(self.stall_timeout)]
        return ([sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(folder / "run"),
                 *timeout, "--", *scenario.command()], {})

    def during(self, run: Run) -> None:
        pass

    def settled(self, run: Run) -> bool:
        """15 s after watch declared a stall: its stall findings and the log rules' are in."""
        return any(t < time.time() - 15 for t, line in output(run)
                   if line.startswith("[stalldoc] STALL #"))

    def read(self, run: Run) -> list[Diagnosis]:
        shown = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(run.folder / "run"),
                                "--format", "json"], capture_output=True, text=True)
        if shown.returncode != 0:
            return []
        report = json.loads(shown.stdout)
        pids = {r["rank"]: r["pid"] for r in report["ranks"]}
        return [said for finding in report["findings"]
                if (said := diagnosis(finding, run, pids))]


def diagnosis(finding: dict, run: Run, pids: dict[int, int]) -> Diagnosis | None:
    """A finding that says the job is stuck, or why: stall findings and the failure kinds; a
    warning about resources (CPU oversubscribed, memory) diagnoses nothing. A finding that
    blames processes that are no rank names them (``evidence.blamed``, where the finding says
    it); else one that blames a process outside the ranks (a server by its address, an engine
    or a driver by its pid) names that part, as its reader would look the address or pid up; a
    rank is named as the part its process is."""
    evidence = finding.get("evidence") or {}
    coded = CAUSES.get(finding["code"], "")
    # a kernel wait words the rank's own wait: a cause of its own only where the code names
    # none more precise than the rank being out of step (SD117's rank waits on its engine)
    cause = said_cause(evidence, coded in ("", "rank_outside_collective")) or coded
    if finding["stall_id"] is None and not coded:
        return None
    frame = evidence.get("frame", "") if isinstance(evidence.get("frame"), str) else ""
    # a rank is the part its process is (a server or an actor in a gloo world is a rank there)
    ranks = frozenset(run.parts.get(pids.get(r, -1), str(r)) for r in finding["ranks"])
    blamed = [b["pid"] for b in evidence.get("blamed") or () if isinstance(b, dict)]
    outside = frozenset(run.parts.get(pid, f"pid {pid}") for pid in blamed) if blamed else \
        frozenset(_parts_named(evidence, run)) - ranks
    blames_outside = bool(blamed) or cause in ("waiting_on_server", "engine_dead",
                                               "engine_asleep")
    culprits = outside if blames_outside and outside else ranks
    return Diagnosis(finding["t"], culprits, frame, cause,
                     f"{finding['code']} {finding['name']}: {finding['summary']}")


# the kinds of SD101's and SD102's ``cause`` whose sentence says the ranks issued different
# collectives ("the ranks ran different numbers of steps", "a branch only some ranks take", ...)
MISMATCH_KINDS = frozenset({"uneven_steps", "skipped_step", "forward_on_some_ranks",
                            "forward_count_differs", "size_mismatch", "some_ranks_only",
                            "collective_order", "different_collectives", "crossed_groups",
                            "train_barrier_skipped"})


# the kinds of SD120's ``cause`` (what holds a Ray job outside its ranks) in the scenarios' words
JOB_WAIT_KINDS = {"placement_group_not_placed": "unschedulable",
                  "rendezvous_incomplete": "rendezvous_missing_node",
                  "server_not_answering": "waiting_on_server", "busy": "cpu_busy",
                  "actor_not_alive": "engine_dead"}


def said_cause(evidence: dict, io: bool = True) -> str:
    """The cause kind a finding's words name beyond its code's: the cause sentence of a
    mismatch, of engines out of step, or of what holds a Ray job outside its ranks; a culprit
    said to be blocked in the kernel on a file, a pipe or a socket ("blocked in
    openat(/mnt/ckpt/...)") waits on I/O (where ``io``). '' when none."""
    cause = evidence.get("cause")
    kind = cause.get("kind", "") if isinstance(cause, dict) else ""
    if kind in MISMATCH_KINDS:
        return "collective_mismatch"
    if kind == "engine_collective":
        return "engine_out_of_step"
    if kind in JOB_WAIT_KINDS:
        return JOB_WAIT_KINDS[kind]
    culprits = evidence.get("culprits")
    blocked = [evidence] + (list(culprits.values()) if isinstance(culprits, dict) else [])
    if io and any(isinstance(e, dict) and e.get("kernel_wait") for e in blocked):
        return "io_wait"
    return ""


def _parts_named(evidence: object, run: Run) -> set[str]:
    """Parts whose pid or listening port appears anywhere in a finding's evidence."""
    found: set[str] = set()
    if isinstance(evidence, dict):
        for key, value in evidence.items():
            if key == "pid" and isinstance(value, int) and value in run.parts:
                found.add(run.parts[value])
            found |= _parts_named(value, run)
    elif isinstance(evidence, list):
        for value in evidence:
            found |= _parts_named(value, run)
    elif isinstance(evidence, str):
        for port in re.findall(r":(\d{2,5})\b", evidence):
            if int(port) in run.ports:
                found.add(run.ports[int(port)])
    return found


ARM = Stalldoc("stalldoc")


def arm(stall_timeout: str) -> Stalldoc:
    return Stalldoc(f"stalldoc:{stall_timeout}", float(stall_timeout))
