"""SD531 and SD532 on the lines Ray 2.60 printed here. SD531: Ray Train (``tests/scenarios/ray_train_ddp.py`` with
FAIL_RANK: a rank raises "corrupt shard" in its training function): with
``FailureConfig(max_failures=1)`` the policy retries, with the default 0 it raises. Ray catches the
exception in the worker and ends the workers cleanly, so these lines are all that tells of it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stalldoc.model.findings import Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import RULES, by_code
from stalldoc.rules.log_signature import LogSignature

BLOCKS = Path(__file__).parent / "fixtures" / "blocks"


def window(name: str) -> Window:
    lines = (BLOCKS / name).read_text(encoding="utf-8").splitlines()
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in lines))


@pytest.mark.parametrize("block,rank,step,decision,limit,severity,then", [
    ("ray_train_retry.txt", 1, 1, "RETRY", "1", Severity.WARNING,
     "ends the group and starts it again, in new processes"),
    ("ray_train_raise.txt", 0, 2, "RAISE", "0", Severity.ERROR, "gives up, the run fails"),
])
def test_a_failed_worker_group_names_its_rank_its_exception_and_what_ray_does(
        block: str, rank: int, step: int, decision: str, limit: str, severity: Severity,
        then: str) -> None:
    [finding] = by_code("SD531")().check(window(block))
    assert finding.ranks == (rank,) and finding.severity == severity
    raised = f"RuntimeError: corrupt shard: rank {rank} read 0 of 4096 bytes at step {step}"
    assert finding.evidence["raised"] == raised
    assert (finding.evidence["decision"], finding.evidence["source"]) == (decision,
                                                                         "worker group")
    assert (finding.evidence["errors"], finding.evidence["max_failures"]) == ("1", limit)
    assert finding.summary == (f"Ray Train's worker group failed (rank {rank}: {raised}), "
                               f"failure 1 of max_failures {limit}: Ray Train {then}")


@pytest.mark.parametrize("block", ["ray_train_retry.txt", "ray_train_raise.txt"])
def test_no_other_log_rule_reads_ray_trains_block(block: str) -> None:
    found = {r.code for r in RULES if issubclass(r, LogSignature) for _ in r().check(
        window(block))}
    assert found == {"SD531"}


# ray_two_worlds.py, rollout rank 1's worker killed with SIGKILL (as the OOM killer ends one): the
# raylet's line to the driver, then the driver's ActorDiedError and the actor's fields
KILLED_PID = 20173


def test_a_killed_actor_is_named_by_its_rank_class_and_pid() -> None:
    from stalldoc.model.ranks import RankProcess
    ranks = tuple(RankProcess(n, pid, n, ("ray::Worker",)) for n, pid in
                  enumerate((20172, KILLED_PID, 20212, 20226)))
    window = Window(100.0, ranks, log=tuple(
        LogLine(99.0, "stderr", t) for t in
        (BLOCKS / "ray_actor_killed.txt").read_text(encoding="utf-8").splitlines()))
    [finding] = by_code("SD532")().check(window)
    assert finding.ranks == (1,) and finding.severity == Severity.CRITICAL
    assert finding.summary.startswith(f"rank 1: Ray actor Worker "
                                      "(3c412405f05018f7631e7f3601000000) died (pid 20173 on "
                                      "192.0.2.2): its worker process ended (SYSTEM_ERROR: "), \
        finding.summary
    # a worker whose pid is no rank's is named as Ray names it, and blames no rank
    [alone] = by_code("SD532")().check(dataclasses.replace(window, ranks=ranks[:1]))
    assert alone.ranks == () and alone.summary.startswith("Ray actor Worker (")
