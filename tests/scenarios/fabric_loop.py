"""A Lightning Fabric training loop written the way Fabric's docs write one, started the way they
say to start it: ``fabric run --accelerator=cpu --strategy=ddp --devices=N fabric_loop.py``. The
``fabric`` console script runs torchrun inside its own process (``torch.distributed.run.main``),
whose agent starts N copies of this script with RANK, LOCAL_RANK and WORLD_SIZE set; ``Fabric()``
reads the accelerator, strategy and devices the CLI put in its environment (and the script
calls no ``fabric.launch()``, which Fabric refuses under its CLI).

Each rank prints ``rank R step S`` as it enters a step and trains a small model on random data for
STEPS steps (default 6), each batch taking STEP_SECONDS (default 0.3) to arrive. With STUCK_RANK
set to a global rank (unset or -1: a healthy run), that rank blocks for good at step STUCK_STEP
(default 2) in a function named STUCK_FUNC (default ``read_batch``) before its backward pass; the
others go on to ``fabric.backward`` and wait in DDP's gradient all-reduce."""
import os
import threading
import time
import types

import torch

import lightning as L

from exit_race import leave

STEPS = int(os.environ.get("STEPS", "6"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.3"))   # each batch's loading
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))
STUCK_FUNC = os.environ.get("STUCK_FUNC", "read_batch")


def read_batch() -> None:
    """Where the stuck rank stops: waits on an event nobody sets."""
    threading.Event().wait()


def _named(name: str):
    """``read_batch`` under the name ``name`` (its code object renamed, as py-spy shows it)."""
    code = read_batch.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, globals(), name)


def main() -> None:
    fabric = L.Fabric()   # no fabric.launch(): under `fabric run` the processes exist already
    fabric.seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    for step in range(STEPS):
        print(f"rank {fabric.global_rank} step {step}", flush=True)
        time.sleep(STEP_SECONDS)   # the batch arrives from storage
        x, y = torch.randn(16, 32), torch.randint(0, 2, (16,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if fabric.global_rank == STUCK_RANK and step == STUCK_STEP:
            _named(STUCK_FUNC)()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    fabric.barrier()
    print(f"rank {fabric.global_rank} done", flush=True)


if __name__ == "__main__":
    main()
    leave()   # clear of torch's own exit race (exit_race.py): this scenario is not about exits
