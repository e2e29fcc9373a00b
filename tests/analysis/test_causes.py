"""Causes decided from Flight Recorder entries (end to end: tests/test_classic_hangs.py)."""
from __future__ import annotations

import pytest

from stalldoc.analysis.causes import difference_cause, skip_line
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
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps"
    assert cause.evidence()["ops"] == {"1": "all_reduce", "0": "barrier"}
    assert cause.evidence()["frames"] == {"1": "train (/job/train.py:51)",
                                          "0": "main (/job/train.py:64)"}
    assert "#11 of group world" in cause.says


# lines users' jobs print when one rank skips a batch after an error (each from its thread)
SKIPS = [
    "| WARNING: ran out of memory, skipping this batch.",                    # pytorch#44353
    "Ran out of memory in the backward pass. Skipping batch due to: CUDA out of memory. Tried "
    "to allocate 1.20 GiB",                                                  # Lightning#5243
    "rank 1: skipping micro-batch 2: NoValidAnchorsError: no sample is long enough",  # Automodel
    "[rank3]: WARNING nan loss at step 812, skipping the update",
]
# skips every rank makes together, and lines that are not skips after an error
NOT_SKIPS = [
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",   # apex
    # Megatron-LM's training_log line: it counts the overflow skips every rank makes together
    " iteration      100/    1000 | consumed samples:         3200 | lm loss: 7.512E+00 | "
    "loss scale: 65536.0 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "Skipping 3 shards already tokenized",
    "eval error rate 0.12 at step 400",
    "{'loss': 0.41, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}",
]


@pytest.mark.parametrize("line", SKIPS)
def test_a_batch_skipped_after_an_error_is_read_from_the_log(line):
    assert skip_line(["step 3 loss 0.2", line, "step 4 loss 0.1"]) == line


@pytest.mark.parametrize("line", NOT_SKIPS)
def test_skips_every_rank_makes_and_other_lines_are_not(line):
    assert skip_line(["step 3 loss 0.2", line]) == ""


def test_uneven_steps_with_a_skip_in_the_log_is_a_skipped_step():
    flight = {0: dump(0, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "barrier", BARRIER, ())),
              1: dump(1, entry(10, "all_reduce", BACKWARD, pending=False),
                      entry(11, "all_reduce", BACKWARD))}
    log = ["step 2 loss 0.3", SKIPS[0], "step 3 loss 0.2"]
    cause = difference_cause(flight, {}, [1], [0], log)
    assert cause is not None and cause.kind == "skipped_step", cause
    assert cause.evidence()["log_line"] == SKIPS[0]
    assert "ReduceOp.MAX" in cause.fix and "drop_last" not in cause.fix
    # the same dumps with a log that shows no such skip: uneven steps, the skip one reading
    quiet = difference_cause(flight, {}, [1], [0], ["step 2 loss 0.3", NOT_SKIPS[0]])
    assert quiet is not None and quiet.kind == "uneven_steps"
    assert "some ranks skipped a step" in quiet.says and "drop_last" in quiet.fix


def test_a_skip_in_the_log_decides_nothing_without_uneven_steps():
    # a branch of some ranks (rank 0 saves) with a skip line in the log: still the branch
    flight = {0: dump(0, entry(6, "all_reduce", STEP, pending=False), entry(7, "barrier", SAVE)),
              1: dump(1, entry(6, "all_reduce", STEP, pending=False), entry(7, "all_reduce", STEP))}
    cause = difference_cause(flight, {}, [1], [0], [SKIPS[0]])
    assert cause is not None and cause.kind == "some_ranks_only", cause


def test_pending_entries_without_frames_take_them_from_the_ranks_stack():
    # the pending entries hold no frames (torch did not record them); the history does
    history = entry(10, "all_reduce", BACKWARD, pending=False)
    flight = {0: dump(0, history, entry(11, "barrier", sizes=())),
              1: dump(1, history, entry(11, "all_reduce"))}
    without = difference_cause(flight, {}, [1], [0])
    assert without is not None and without.kind == "different_collectives"   # all it can tell
    assert "too few frames" in without.says and "different collectives" in without.says
    cause = difference_cause(flight, {1: stacks(1, BACKWARD), 0: stacks(0, BARRIER)}, [1], [0])
    assert cause is not None and cause.kind == "uneven_steps"


def test_a_rank_waiting_before_its_first_step_did_not_run_fewer_steps():
    # KempnerForge#49: rank 0 sees the checkpoint and broadcasts it from load(); rank 1 does not,
    # skips the branch and is in its first backward() already
    load = (Frame("broadcast", f"{TORCH}/distributed/distributed_c10d.py", 2800),
            Frame("load", "/job/ckpt.py", 30), Frame("main", "/job/train.py", 60))
    flight = {0: dump(0, entry(3, "broadcast", load, sizes=((1,),))),
              1: dump(1, entry(3, "all_reduce", BACKWARD))}
    cause = difference_cause(flight, {}, [1], [0])
    assert cause is not None and cause.kind == "some_ranks_only", cause
    assert cause.evidence()["branch_rank"] == 0
    assert cause.evidence()["branch_frames"] == ["load (/job/ckpt.py:30)",
                                                 "main (/job/train.py:60)"]


SAVE = (Frame("barrier", f"{TORCH}/distributed/distributed_c10d.py", 5349),
        Frame("save_checkpoint", "/job/train.py", 7), Frame("main", "/job/train.py", 19))
STEP = (Frame("main", "/job/train.py", 17),)
METRICS = (Frame("log_metrics", "/job/metrics.py", 3), Frame("main", "/job/train.py", 21))


def test_a_collective_the_other_rank_never_called_is_on_a_branch_of_some_ranks():
    # rank 0 calls a barrier inside save_checkpoint (only rank 0 saves); rank 1 went on to the
    # next step's all_reduce, which rank 0 called too, earlier
    flight = {0: dump(0, entry(6, "all_reduce", STEP, pending=False), entry(7, "barrier", SAVE)),
              1: dump(1, entry(6, "all_reduce", STEP, pending=False), entry(7, "all_reduce", STEP))}
    for culprits, others in (([0], [1]), ([1], [0])):      # whichever side a rule blames
        cause = difference_cause(flight, {}, culprits, others)
        assert cause is not None and cause.kind == "some_ranks_only"
        facts = cause.evidence()
        assert facts["branch_rank"] == 0
        assert facts["branch_frames"] == ["save_checkpoint (/job/train.py:7)",
                                          "main (/job/train.py:19)"]
        assert "called from main (/job/train.py:19)" in cause.fix


def test_collectives_both_ranks_issue_elsewhere_too_are_in_a_different_order():
    flight = {0: dump(0, entry(6, "all_reduce", METRICS, pending=False),
                      entry(7, "broadcast", STEP)),
              1: dump(1, entry(6, "broadcast", STEP, pending=False),
                      entry(7, "all_reduce", METRICS))}
    cause = difference_cause(flight, {}, [0], [1])
    assert cause is not None and cause.kind == "collective_order"
    assert "main (/job/train.py:17)" in cause.says and "log_metrics (/job/metrics.py:3)" in \
        cause.says


def test_frames_from_the_stacks_name_where_each_side_waits_but_decide_no_branch():
    # a job without DDP: the dumps hold no frames, the stacks show where each rank waits; the
    # other rank's history has no frames either, so "never called there" cannot be told
    flight = {0: dump(0, entry(6, "all_reduce", sizes=((4,),), pending=False),
                      entry(7, "barrier", sizes=())),
              1: dump(1, entry(6, "all_reduce", sizes=((4,),), pending=False),
                      entry(7, "all_reduce", sizes=((4,),)))}
    cause = difference_cause(flight, {0: stacks(0, SAVE), 1: stacks(1, (
        Frame("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 2950),) + STEP)}, [0], [1])
    assert cause is not None and cause.kind == "different_collectives"
    assert cause.evidence()["frames"] == {"0": "save_checkpoint (/job/train.py:7)",
                                          "1": "main (/job/train.py:17)"}


def test_no_cause_without_a_pending_collective_on_the_culprit_or_a_difference():
    same = entry(5, "all_reduce", BACKWARD)
    assert difference_cause({0: dump(0, same), 1: dump(1, same)}, {}, [1], [0]) is None
    behind = {0: dump(0, entry(5, "all_reduce", BACKWARD)),
              1: dump(1, entry(4, "all_reduce", BACKWARD, pending=False))}
    assert difference_cause(behind, {}, [1], [0]) is None        # stuck in its own code
    assert difference_cause({0: dump(0, same)}, {}, [1], [0]) is None   # no dump of rank 1
