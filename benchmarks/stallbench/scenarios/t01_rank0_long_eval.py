"""Healthy: rank 0 scores a long validation set alone while the other ranks wait in a barrier

source: https://github.com/rwth-i6/returnn/issues/1621
shape: only the main process runs the evaluation loop after an epoch (a generation-heavy
  metric, minutes long) while every other rank waits for it in a barrier; slow, not stuck
launch: torchrun 3
truth: healthy
needs: torch
budget: 150
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


def score_validation_set(model: torch.nn.Module, seconds: float) -> float:
    total, end = 0.0, time.time() + seconds
    with torch.no_grad():
        while time.time() < end:
            total += float(model.module(torch.randn(256, 64)).sum())
    return total


def main() -> None:
    rank, world = jobkit.init()
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for number in range(20):
            loss = model(torch.randn(16, 64)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            jobkit.step(number)
            time.sleep(0.2)
        if epoch == 0:
            jobkit.hang_begins("the long quiet phase: rank 0 evaluates, the others wait")
            if rank == 0:
                score_validation_set(model, 120.0)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
