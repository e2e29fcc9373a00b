"""Which ranks wait on their own processes, and whose children's stacks are taken on a stall
(end to end, with a real deadlocked DataLoader worker: tests/test_classic_hangs.py)."""
from __future__ import annotations

from stalldoc.analysis.stacks import child_wait
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.sidecar.children import MAX_CHILDREN, waited_children

LIB = "/venv/lib/python3.11"
DATALOADER_WAIT = (   # py-spy's names on Python 3.11: methods by their qualified name
    Frame("_PollLikeSelector.select", f"{LIB}/selectors.py", 415),
    Frame("wait", f"{LIB}/multiprocessing/connection.py", 947),
    Frame("Queue.get", f"{LIB}/multiprocessing/queues.py", 113),
    Frame("_MultiProcessingDataLoaderIter._try_get_data",
          f"{LIB}/site-packages/torch/utils/data/dataloader.py", 1300),
    Frame("train", "/job/train.py", 62))
POOL_WAIT = (Frame("Condition.wait", f"{LIB}/threading.py", 327),
             Frame("ApplyResult.wait", f"{LIB}/multiprocessing/pool.py", 765),
             Frame("ApplyResult.get", f"{LIB}/multiprocessing/pool.py", 768),
             Frame("preprocess", "/job/prep.py", 9))
COLLECTIVE = (Frame("all_reduce", f"{LIB}/site-packages/torch/distributed/distributed_c10d.py",
                    2950), Frame("train", "/job/train.py", 70))


def stacks(rank: int, frames: tuple[Frame, ...]) -> RankStacks:
    pid = 100 + rank
    return RankStacks(rank, pid, 0.0, "py-spy", (ThreadStack(pid, "MainThread", False, False,
                                                             frames),))


def test_the_wait_is_named_for_the_most_specific_process_it_waits_on():
    assert child_wait(stacks(0, DATALOADER_WAIT).main) == "DataLoader worker"
    assert child_wait(stacks(0, POOL_WAIT).main) == "pool worker"
    assert child_wait(stacks(0, COLLECTIVE).main) == ""
    assert child_wait(None) == ""


def test_only_ranks_waiting_on_their_children_get_their_children_dumped():
    ranks = {r: RankProcess(r, 100 + r, r, ("python", "train.py")) for r in range(3)}
    rank_stacks = {0: stacks(0, COLLECTIVE), 1: stacks(1, DATALOADER_WAIT),
                   2: stacks(2, POOL_WAIT)}
    parents = {100: 1, 101: 1, 102: 1, 500: 100, 501: 101, 502: 101, 503: 102,
               **{600 + i: 102 for i in range(20)}}   # a pool of 20: the first MAX_CHILDREN
    found = waited_children(ranks, rank_stacks, parents)
    assert set(found) == {1, 2}                         # rank 0 waits in a collective
    assert found[1] == [501, 502]
    assert found[2] == sorted([503, *range(600, 620)])[:MAX_CHILDREN]
    assert waited_children(ranks, {1: stacks(1, DATALOADER_WAIT)}, {101: 1}) == {}   # none
