"""A healthy pure-DDP loop: a small MLP in DistributedDataParallel, whose only collectives are the
reducer's (issued from C++, past the agent's wrappers), and no log lines, phases or markers.

STEPS steps; each rank idles STEP_PAUSE seconds before each step (its Python waiting, as on a
device or a slow loader). At step SLOW_STEP rank SLOW_RANK computes on the CPU for SLOW_SECONDS
first, while the other ranks wait in the reducer's all_reduce inside backward(). WIDTH sets the
hidden layers (12288: 576 MB of gradients a step; a layer's gradient is a bucket of its own).
At the end each rank writes its process group's sequence number to COUNTS_DIR/rank_<rank> (when
set): the collectives torch itself counted, for the test to compare with what the agent saw.
It leaves through ``exit_race.leave()``, clear of torch 2.13's own exit race; ``EXIT_RACE=keep``
ends it the ordinary way instead (``benchmarks/exit_aborts.py``)."""
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from exit_race import leave

STEPS = int(os.environ.get("STEPS", "12"))
STEP_PAUSE = float(os.environ.get("STEP_PAUSE", "0"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_STEP = int(os.environ.get("SLOW_STEP", "3"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "0"))
WIDTH = int(os.environ.get("WIDTH", "64"))   # the hidden layer: 8192 makes 268 MB of gradients


def augment_batch(seconds: float) -> int:
    """CPU-bound work standing in for a slow step (data augmentation in Python)."""
    deadline, total = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        total += sum(i * i for i in range(2000))
    return total


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, WIDTH), nn.ReLU(),
                                                  nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                                                  nn.Linear(WIDTH, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        began = time.monotonic()
        time.sleep(STEP_PAUSE)
        if dist.get_rank() == SLOW_RANK and step == SLOW_STEP:
            augment_batch(SLOW_SECONDS)
        loss = model(torch.randn(16, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if os.environ.get("PRINT_STEP_TIMES"):
            print(f"rank {dist.get_rank()} step {step} {time.monotonic() - began:.2f} s",
                  flush=True)
    counts = os.environ.get("COUNTS_DIR")
    if counts:
        seq = dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()
        with open(os.path.join(counts, f"rank_{dist.get_rank()}"), "w") as fh:
            fh.write(str(seq))
    dist.destroy_process_group()
    leave()


if __name__ == "__main__":
    main()
