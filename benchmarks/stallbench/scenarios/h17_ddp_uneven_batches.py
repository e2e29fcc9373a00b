"""DDP ranks get different numbers of batches; the rank with one more waits in the gradient sync

source: https://github.com/pytorch/pytorch/issues/33148
shape: a DDP job whose sampler gives rank 0 one batch more than rank 1 (an unevenly split
  dataset without drop_last); rank 1 leaves the epoch loop and evaluates, rank 0's backward
  waits in the reducer's all-reduce for a gradient rank 1 never sends
launch: torchrun 2
truth: hang
culprit: 1
frame: evaluate
cause: rank_outside_collective
needs: torch
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


def evaluate(model: torch.nn.Module) -> float:
    jobkit.hang_begins("rank 1 left the epoch loop: it evaluates on its own, outside the sync")
    total, end = 0.0, time.time() + 3600
    with torch.no_grad():
        while time.time() < end:   # a long eval set, scored on this rank alone
            total += float(model.module(torch.randn(64, 16)).sum())
            time.sleep(0.05)
    return total


def main() -> None:
    rank, world = jobkit.init()
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 12 if rank == 0 else 11
    for number in range(batches):
        if rank == 0 and number == batches - 1:
            jobkit.hang_begins("rank 0's extra batch: its backward waits for rank 1")
        loss = model(torch.randn(32, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(number)
        time.sleep(0.3)
    evaluate(model)
    dist.barrier()


if __name__ == "__main__":
    main()
