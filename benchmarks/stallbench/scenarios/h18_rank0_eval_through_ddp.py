"""Rank 0 evaluates through the DDP wrapper; its forward broadcasts buffers while rank 1 sits in barrier()

source: https://github.com/pytorch/pytorch/issues/54059
shape: a DDP classifier with BatchNorm (buffers broadcast in every forward) trains an epoch, then
  `if rank == 0: evaluate(model)` under torch.no_grad() calls the DDP wrapper, not model.module;
  rank 0's forward waits in DDP's buffer broadcast while rank 1 waits in dist.barrier()
launch: torchrun 2
truth: hang
culprit: 0
frame: evaluate
cause: collective_mismatch
needs: torch
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.BatchNorm1d(32),
                                        torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def evaluate(model: torch.nn.Module, batches: int = 20) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for number in range(batches):
            x, y = torch.randn(64, 20), torch.randint(0, 4, (64,))
            if number == 0:
                jobkit.hang_begins("rank 0 evaluates through the DDP wrapper: its forward "
                                   "broadcasts buffers, rank 1 is in barrier()")
            correct += int((model(x).argmax(-1) == y).sum())
            total += len(y)
    model.train()
    return correct / total


def train_one_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> None:
    loss_fn = torch.nn.CrossEntropyLoss()
    for number in range(15):
        x, y = torch.randn(32, 20), torch.randint(0, 4, (32,))
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(epoch * 15 + number)
        time.sleep(0.2)


def main() -> None:
    rank, world = jobkit.init()
    model = DistributedDataParallel(Classifier(), broadcast_buffers=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        train_one_epoch(model, optimizer, epoch)
        if rank == 0:
            accuracy = evaluate(model)
            print(f"epoch {epoch}: val accuracy {accuracy:.3f}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
