"""Causes decided from Flight Recorder entries (the end-to-end cases: tests/test_classic_hangs.py)."""
from __future__ import annotations

from stalldoc.analysis.causes import missing_rank_cause
from stalldoc.model.collectives import FlightDump, FlightEntry
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack

TORCH = "/venv/lib/python3.11/site-packages/torch"
BACKWARD = (Frame("_engine_run_backward", f"{TORCH}/autograd/graph.py", 979),
            Frame("backward", f"{TORCH}/autograd/__init__.py", 395),
            Frame("train", "/job/train.py", 51))
BARRIER = (Frame("barrier", f"{TORCH}/distributed/distributed_c10d.py", 5349),
           Frame("main", "/job/train.py", 64))


def entry(seq: int, op: str, frames: tuple[Frame, ...] = (), sizes=((2,),), pending=True,
          ) -> FlightEntry:
    return FlightEntry("0", "default_pg", seq, False, f"gloo:{op}",
                       "scheduled" if pending else "completed", not pending, sizes, (), frames)


def dump(rank: int, *entries: FlightEntry) -> FlightDump:
    return FlightDump(rank, f"flight/rank_{rank}", {"0": (0, 1)}, entries)


def stacks(rank: int, frames: tuple[Frame, ...]) -> RankStacks:
    main = ThreadStack(100 + rank, "MainThread", False, False, frames)
    return RankStacks(rank, 100 + rank, 0.0, "py-spy", (main,))


def test_a_gradient_all_reduce_against_a_barrier_is_uneven_steps():
    flight = {0: dump(0, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "barrier", BARRIER, ())),
              1: dump(1, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "all_reduce", BACKWARD))}
    cause = missing_rank_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps"
    assert cause.evidence()["ops"] == {"1": "all_reduce", "0": "barrier"}
    assert cause.evidence()["frames"] == {"1": "train (/job/train.py:51)",
                                          "0": "main (/job/train.py:64)"}
    assert "#11 of group world" in cause.says


def test_dumps_without_frames_take_the_backward_pass_from_the_ranks_stack():
    flight = {0: dump(0, entry(11, "barrier", sizes=())), 1: dump(1, entry(11, "all_reduce"))}
    without = missing_rank_cause(flight, {}, [1], [0])
    assert without is not None and without.kind == "collective_order"   # all it can tell
    cause = missing_rank_cause(flight, {1: stacks(1, BACKWARD), 0: stacks(0, BARRIER)}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps"


def test_a_broadcast_against_an_all_reduce_outside_backward_is_collective_order():
    flight = {0: dump(0, entry(7, "broadcast", (Frame("save", "/job/ckpt.py", 9),))),
              1: dump(1, entry(7, "all_reduce", (Frame("log_metrics", "/job/m.py", 3),)))}
    cause = missing_rank_cause(flight, {}, [0], [1])
    assert cause is not None and cause.kind == "collective_order"
    assert "save (/job/ckpt.py:9)" in cause.says and "log_metrics (/job/m.py:3)" in cause.says


def test_no_cause_without_a_pending_collective_on_the_culprit_or_a_difference():
    same = entry(5, "all_reduce", BACKWARD)
    assert missing_rank_cause({0: dump(0, same), 1: dump(1, same)}, {}, [1], [0]) is None
    behind = {0: dump(0, entry(5, "all_reduce", BACKWARD)),
              1: dump(1, entry(4, "all_reduce", BACKWARD, pending=False))}
    assert missing_rank_cause(behind, {}, [1], [0]) is None        # stuck in its own code
    assert missing_rank_cause({0: dump(0, same)}, {}, [1], [0]) is None   # no dump of rank 1
