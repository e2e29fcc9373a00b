"""DDP training where the gradient all-reduce comes from DDP's C++ reducer (which the agent does
not wrap): at step STUCK_STEP rank STUCK_RANK goes into ``load_shard`` and never returns, while
the other ranks wait in the reducer's all_reduce inside backward()."""
import os
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STUCK_RANK = int(os.environ.get("STUCK_RANK", "2"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))


def load_shard(step: int) -> torch.Tensor:
    if dist.get_rank() == STUCK_RANK and step == STUCK_STEP:
        threading.Event().wait()   # a read that never returns
    return torch.ones(4, 8) * step


def main() -> None:
    dist.init_process_group("gloo")
    model = DistributedDataParallel(nn.Linear(8, 2))
    for step in range(STUCK_STEP + 3):
        model(load_shard(step)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
