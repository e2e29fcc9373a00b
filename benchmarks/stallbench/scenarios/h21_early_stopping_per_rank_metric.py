"""Each rank early-stops on its own un-gathered validation metric; one stops and waits in the final barrier

source: https://github.com/huggingface/transformers/issues/17478
shape: a DDP regression job with early stopping (patience 1) whose validation metric is computed
  on each rank's own shard and never gathered, so the ranks disagree; rank 2 decides to stop and
  waits in the end-of-training dist.barrier() while ranks 0 and 1 train on into the gradient all-reduce
launch: spawn 3
truth: hang
culprit: 2
frame: finish_training
cause: collective_mismatch
needs: torch
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

TRUE_WEIGHTS = torch.linspace(-1, 1, 16).unsqueeze(1)


def shard(rank: int, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank * 100 + (split == "val"))
    x = torch.randn(size, 16, generator=generator)
    noise = 2.0 if (split == "val" and rank == 2) else 0.05   # rank 2's dev shard is noisy
    return x, x @ TRUE_WEIGHTS + noise * torch.randn(size, 1, generator=generator)


class EarlyStopping:
    def __init__(self, patience: int = 1, min_relative_delta: float = 0.02) -> None:
        self.patience, self.min_relative_delta = patience, min_relative_delta
        self.best, self.bad_epochs = float("inf"), 0

    def should_stop(self, metric: float) -> bool:
        if metric < self.best * (1 - self.min_relative_delta):
            self.best, self.bad_epochs = metric, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs > self.patience


def evaluate(model: DistributedDataParallel, rank: int) -> float:
    x, y = shard(rank, "val", 256)
    with torch.no_grad():   # this rank's shard only: the metric is never all-reduced
        return float(torch.nn.functional.mse_loss(model.module(x), y))


def finish_training(model: DistributedDataParallel, rank: int) -> None:
    jobkit.hang_begins(f"rank {rank} early-stopped on its own metric and waits in the final barrier")
    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), "final.pt")


def train(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    x_train, y_train = shard(rank, "train", 320)
    stopper, step = EarlyStopping(), 0
    for epoch in range(40):
        for start in range(0, 320, 64):
            loss = torch.nn.functional.mse_loss(model(x_train[start:start + 64]),
                                                y_train[start:start + 64])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            jobkit.step(step)
            step += 1
            time.sleep(0.1)
        metric = evaluate(model, rank)
        print(f"rank {rank} epoch {epoch} val_mse {metric:.4f}", flush=True)
        if stopper.should_stop(metric):
            print(f"rank {rank}: early stopping at epoch {epoch}", flush=True)
            break
    finish_training(model, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    jobkit.spawn(train, 3)
