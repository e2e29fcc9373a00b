"""The ranks' engine preemptions, tick after tick, from the counts their agents wrote."""
from __future__ import annotations

from stalldoc.model.ranks import EnginePreemptions, EngineProcess, RankProcess
from stalldoc.sidecar.preemptions import READ_EVERY, RECENT, PreemptionWatch

RANKS = [RankProcess(0, 100, 0, ("python", "train.py")), RankProcess(1, 200, 1, ("python",))]
# rank 0's engine runs in processes of its own; rank 1's in the rank (colocated)
ENGINES = [EngineProcess(110, "engine core", 0), EngineProcess(111, "worker", 0, 0, 1)]


def _count(tmp_path, pid: int, count: int) -> None:
    with open(tmp_path / f"preempted-{pid}.txt", "a") as fh:
        fh.write(f"{count}\n")


def test_each_ranks_preemptions_lately_and_so_far(tmp_path):
    watch = PreemptionWatch(str(tmp_path))
    # GIVEN rank 0's engine core preempted 30 requests before the first read, rank 1 none
    _count(tmp_path, 110, 30)
    assert watch.refresh(1000.0, RANKS, ENGINES) == {0: EnginePreemptions(0, 30, 30, RECENT)}
    # WHEN its count rises, and rank 1's own engine starts preempting
    _count(tmp_path, 110, 50)
    _count(tmp_path, 200, 4)
    # THEN a read sooner than READ_EVERY reads nothing new
    assert watch.refresh(1000.0 + READ_EVERY / 2, RANKS, ENGINES)[0].total == 30
    seen = watch.refresh(1010.0, RANKS, ENGINES)
    assert seen == {0: EnginePreemptions(0, 50, 50, RECENT), 1: EnginePreemptions(1, 4, 4, RECENT)}
    # AND a minute later with no more preemptions, none are recent, the total stays
    later = watch.refresh(1010.0 + RECENT + 1, RANKS, ENGINES)
    assert later[0] == EnginePreemptions(0, 50, 0, RECENT) and later[1].recent == 0
    # AND the ones of the last minute are counted from the count a minute ago
    _count(tmp_path, 110, 65)
    assert watch.refresh(1010.0 + RECENT + 10, RANKS, ENGINES)[0].recent == 15


def test_a_worker_counts_nothing_and_no_directory_reads_nothing(tmp_path):
    _count(tmp_path, 111, 99)   # a worker runs no scheduler: not a count of the rank's
    assert PreemptionWatch(str(tmp_path)).refresh(1.0, RANKS, ENGINES) == {}
    assert PreemptionWatch(None).refresh(1.0, RANKS, ENGINES) == {}
