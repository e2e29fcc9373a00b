"""A run's score: what the arm said against the scenario's truth."""
from __future__ import annotations

from dataclasses import dataclass

from harness import Diagnosis, Run
from scenario import Scenario

TOGETHER = 2.0   # seconds: diagnoses this close to the one scored are one statement


@dataclass(frozen=True)
class Score:
    scenario: str
    arm: str
    truth: str                     # hang | healthy
    reached: bool                  # the scenario got to its hang (or quiet phase)
    said: str                      # the diagnosis scored, as the arm put it ('' when none)
    culprit: bool = False
    frame: bool = False
    cause: bool = False
    seconds: float | None = None   # hang -> first diagnosis naming the culprit right
    first: float | None = None     # hang -> first diagnosis of any kind
    false_stall: bool = False      # healthy: the arm declared a hang
    killed: bool = False           # healthy: the job ended early, non-zero
    skipped: str = ""              # why the arm did not run the scenario


def score(scenario: Scenario, arm: str, run: Run, said: list[Diagnosis]) -> Score:
    reached = run.hang_at is not None
    if not scenario.hang:
        killed = run.exit_code not in (None, 0)
        return Score(scenario.name, arm, "healthy", reached, said[0].text if said else "",
                     false_stall=bool(said), killed=killed)
    if not reached:
        return Score(scenario.name, arm, "hang", False, "")
    after = sorted((d for d in said if d.t >= run.hang_at), key=lambda d: d.t)
    right = [d for d in after if culprit_right(scenario, d)]
    if not after:
        return Score(scenario.name, arm, "hang", True, "")
    # what the arm said at once: the first diagnosis naming the culprit right (else the first)
    # and whatever it said within TOGETHER seconds of it
    lead = right[0] if right else after[0]
    together = [d for d in after if abs(d.t - lead.t) <= TOGETHER]
    return Score(scenario.name, arm, "hang", True, lead.text, culprit=bool(right),
                 frame=any(frame_right(scenario, d) for d in together),
                 cause=any(d.cause == scenario.cause for d in together),
                 seconds=right[0].t - run.hang_at if right else None,
                 first=after[0].t - run.hang_at)


def culprit_right(scenario: Scenario, said: Diagnosis) -> bool:
    return bool(said.culprits) and said.culprits == frozenset(scenario.culprits)


def frame_right(scenario: Scenario, said: Diagnosis) -> bool:
    """The function named is the truth's (a method by its own name or its qualified one)."""
    name = said.frame.split(" (")[0]
    return bool(name) and (name == scenario.frame or name.rsplit(".", 1)[-1] == scenario.frame)
