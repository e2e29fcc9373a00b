"""Ranks train with a collective per step; at step STUCK_STEP rank STUCK_RANK goes into a user
function (named by STUCK_FUNC) and never returns, while the others wait in OP. With STEP_PHASE
set, each step is marked as the training step (``stalldoc.phase("step")``), as a script that
marks its phases itself does."""
import contextlib
import os
import threading
import time

import torch
import torch.distributed as dist

STUCK_RANK = int(os.environ.get("STUCK_RANK", "1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))
OP = os.environ.get("OP", "all_reduce")


def _never_returns() -> None:
    threading.Event().wait()


def _refuse_tracing() -> None:
    """Make this process non-dumpable: a tracer without CAP_SYS_PTRACE is then denied, as in a
    container without the capability."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def _run_op(tensor: torch.Tensor) -> None:
    if OP == "all_reduce":
        dist.all_reduce(tensor)
    elif OP == "all_gather":
        dist.all_gather([torch.empty_like(tensor) for _ in range(dist.get_world_size())], tensor)
    elif OP == "broadcast":
        dist.broadcast(tensor, src=0)
    else:
        dist.barrier()


def main() -> None:
    dist.init_process_group("gloo")
    name = os.environ.get("STUCK_FUNC", "fetch_batch")
    stuck = type(_never_returns)(_never_returns.__code__.replace(co_name=name, co_qualname=name),
                                 globals())
    marked = os.environ.get("STEP_PHASE")
    for step in range(STUCK_STEP + 3):
        with (_step_phase() if marked else contextlib.nullcontext()):
            if dist.get_rank() == STUCK_RANK and step == STUCK_STEP:
                if os.environ.get("REFUSE_TRACING"):
                    _refuse_tracing()
                stuck()
            _run_op(torch.ones(16) * step)
            time.sleep(0.1)
    dist.destroy_process_group()


def _step_phase():
    import stalldoc
    return stalldoc.phase("step")


if __name__ == "__main__":
    main()
