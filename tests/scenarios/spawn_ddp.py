"""PyTorch's DDP tutorial, as users copy it: ``mp.spawn(demo_basic, args=(world_size,),
nprocs=world_size)``; each process sets MASTER_ADDR / MASTER_PORT and calls
``init_process_group("gloo", rank=rank, world_size=world_size)`` itself: no process has RANK in
its environment. With STUCK_RANK set, that rank blocks at STUCK_STEP in a function named
STUCK_FUNC (default ``load_shard``) and the others wait in DDP's gradient all-reduce."""
import os
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = int(os.environ.get("WORLD", "3"))
STEPS = int(os.environ.get("STEPS", "6"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))
PORT = os.environ.get("PORT", "12355")
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = PORT
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def _stuck():
    threading.Event().wait()


def demo_basic(rank, world_size):
    setup(rank, world_size)
    name = os.environ.get("STUCK_FUNC", "load_shard")
    stuck = type(_stuck)(_stuck.__code__.replace(co_name=name, co_qualname=name), globals())
    ddp_model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(STEPS):
        if rank == STUCK_RANK and step == STUCK_STEP:
            stuck()
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        loss_fn(outputs, torch.randn(20, 5)).backward()
        optimizer.step()
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(STEP_SECONDS)
    cleanup()


if __name__ == "__main__":
    mp.spawn(demo_basic, args=(WORLD,), nprocs=WORLD, join=True)
