"""A DDP rank is stopped (SIGSTOP) mid-step; the other ranks wait for its gradients

source: https://github.com/rwth-i6/sisyphus/issues/176
shape: a 3-rank DDP training job started with torch.multiprocessing.spawn on gloo; in the
  middle of a step one rank's process is stopped (state T: the thread found a SIGSTOP nobody
  sent on purpose; here the rank stops itself), so the others wait in the gradient all-reduce
launch: spawn 3
truth: hang
culprit: 1
frame: train_step
cause: stopped_rank
needs: torch
"""
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class SpeechEncoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frontend = torch.nn.Conv1d(8, 16, kernel_size=3, padding=1)
        self.encoder = torch.nn.GRU(16, 32, batch_first=True)
        self.output = torch.nn.Linear(32, 10)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.frontend(features)).transpose(1, 2)
        encoded, _ = self.encoder(hidden)
        return self.output(encoded)


def train_step(model, optimizer, features, targets, rank: int, number: int) -> float:
    logits = model(features)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 10), targets.reshape(-1))
    if rank == 1 and number == 6:
        jobkit.hang_begins("rank 1 is stopped (SIGSTOP) between its forward and its backward")
        os.kill(os.getpid(), signal.SIGSTOP)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def main(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(rank)
    model = DistributedDataParallel(SpeechEncoder())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for number in range(40):
        features, targets = torch.randn(4, 8, 50), torch.randint(0, 10, (4, 50))
        loss = train_step(model, optimizer, features, targets, rank, number)
        jobkit.step(number)
        if rank == 0:
            print(f"step {number} loss {loss:.3f}", flush=True)
        time.sleep(0.3)
    dist.destroy_process_group()


if __name__ == "__main__":
    jobkit.spawn(main, 3)
