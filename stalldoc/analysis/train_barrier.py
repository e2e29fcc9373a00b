"""A rank that waits in Ray Train's own barrier of every worker, which the others skipped.

Ray Train (Train V2) makes ``ray.train.report`` with a checkpoint, and
``ray.train.collective.barrier`` / ``broadcast_from_rank_zero``, barriers of every worker of the
run: each worker asks the run's synchronization actor and waits in ``ray.get`` until every rank
has asked. No torch.distributed call is made, so neither the agent's rings nor the Flight
Recorder hold it: seen from the torch collectives alone, a rank in that barrier is outside the
collective the others wait in. When the others wait in a torch collective and none of them is in
the barrier, they went past it without calling it (the barrier comes before that collective in
the program of the rank that waits in it): each side waits for the other, and the ranks that
skipped the call are the ones to look at (Ray Train's own warning names them: "waiting for the
following ranks to join the `ray.train.report` call").
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping

from stalldoc.analysis.causes import Cause, main_of
from stalldoc.analysis.stacks import user_frame
from stalldoc.detect.stack_kind import file_pattern, frame_in, frame_wait
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack

KIND = "train_barrier_skipped"
_EXECUTION = f"ray{os.sep}train{os.sep}v2{os.sep}_internal{os.sep}execution{os.sep}"
# (file, function names): Ray Train's calls that wait for every worker
_BARRIERS = ((file_pattern(f"{_EXECUTION}context.py"),
              frozenset({"_sync_checkpoint_dir_name_across_ranks"})),
             (file_pattern(f"{_EXECUTION}collective_impl.py"),
              frozenset({"barrier", "broadcast_from_rank_zero"})))
_REPORT = file_pattern(f"ray{os.sep}train{os.sep}v2{os.sep}api{os.sep}train_fn_utils.py")
FIX = ("Every Ray Train worker must call ray.train.report (and ray.train.collective.barrier, "
       "broadcast_from_rank_zero) the same number of times, Ray Train's docs say, 'otherwise, "
       "your training will hang': a report with a checkpoint is a barrier of every worker. Call "
       "it on every rank and give the checkpoint only where one is saved (checkpoint=None "
       "elsewhere) instead of skipping the call on the other ranks.")


def train_barrier(thread: ThreadStack | None) -> tuple[str, Frame] | None:
    """(the Ray Train call, its barrier's frame) the thread waits in, else None: its innermost
    wait is ``ray.get`` and a frame further out is one of Ray Train's barriers."""
    if thread is None or not thread.frames or frame_wait(thread.frames[0]) != "ray.get":
        return None
    for index, frame in enumerate(thread.frames):
        if any(frame_in(frame, pattern, names) for pattern, names in _BARRIERS):
            return _call(thread.frames[index:], frame), frame
    return None


def _call(outward: tuple[Frame, ...], barrier: Frame) -> str:
    """The public call that led into the barrier (``ray.train.report`` for a report)."""
    if any(frame_in(f, _REPORT, frozenset({"report"})) for f in outward):
        return "ray.train.report"
    return f"ray.train.collective.{barrier.name}"


def train_barrier_cause(stacks: Mapping[int, RankStacks], culprits: Iterable[int],
                        waiting: Iterable[int]) -> Cause | None:
    """``train_barrier_skipped`` when every culprit (missing from the collective the waiting
    ranks sit in) waits in one Ray Train barrier and no waiting rank does; else None."""
    culprits, waiting = sorted(culprits), sorted(waiting)
    found = {r: train_barrier(main_of(stacks, r)) for r in culprits}
    if not culprits or not waiting or any(v is None for v in found.values()) \
            or any(train_barrier(main_of(stacks, r)) for r in waiting):
        return None
    call = found[culprits[0]][0]
    mine = user_frame(main_of(stacks, culprits[0]))
    return Cause(KIND, _says(call, culprits, waiting), FIX, {
        "call": call, "barrier_ranks": culprits, "skipped_ranks": waiting,
        "barrier_frame": str(mine) if mine is not None else ""})


def _says(call: str, barrier: list[int], skipped: list[int]) -> str:
    ins, outs = _ranks(barrier), _ranks(skipped)
    one_in, one_out = len(barrier) == 1, len(skipped) == 1
    return (f"{ins} {'waits' if one_in else 'wait'} there in {call}, a barrier of every Ray "
            f"Train worker, which {outs} never joined: {outs} went on past it to the collective "
            f"{'it waits' if one_out else 'they wait'} in, and each side waits for the other; "
            f"{outs} skipped a {call} the others made (a call under a branch on the rank?)")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
