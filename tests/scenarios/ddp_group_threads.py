"""What a careful script's teardown leaves running: three training steps (AdamW), then the model,
optimizer and groups freed and collected, then ``destroy_process_group()``. Each rank prints the
names of its gloo threads left after that ("rank N gloo threads: ...").

MODEL picks the step: ``ddp`` (a DistributedDataParallel model), ``all_reduce`` (gradients
all-reduced by hand on the default group) or ``dp_group`` (by hand over a data-parallel group
made with ``new_group`` and passed as ``group=``, as Megatron-style code does).

On torch 2.13, importing ``torch._dynamo`` while a process group exists keeps references to that
group that are never released; ``optimizer.step()`` and DDP import it on first use. So in an
ordinary script the group's gloo threads outlive ``destroy_process_group()`` and live on into
interpreter exit, where torch's exit race can abort the rank. With DYNAMO_FIRST=1 the script
imports ``torch._dynamo`` before ``init_process_group()``, and the threads end at
``destroy_process_group()`` (SD115's fix rests on both)."""
import gc
import os
import time

import torch

if os.environ.get("DYNAMO_FIRST") == "1":
    import torch._dynamo  # noqa: F401  (before any process group exists)
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from exit_race import leave

MODEL = os.environ.get("MODEL", "ddp")


def thread_name(tid: str) -> str:
    """The thread's name ('' once it has exited: the threads are ending as we look)."""
    try:
        with open(f"/proc/self/task/{tid}/comm") as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return ""


def gloo_threads() -> list[str]:
    return sorted(name for name in map(thread_name, os.listdir("/proc/self/task"))
                  if "gloo" in name)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, group) -> None:
    model(torch.randn(8, 16)).square().mean().backward()
    if MODEL != "ddp":
        for param in model.parameters():
            dist.all_reduce(param.grad, group=group)
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    group = dist.new_group(list(range(dist.get_world_size()))) if MODEL == "dp_group" else None
    if MODEL == "ddp":
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        train_step(model, optimizer, group)
    model = optimizer = group = None
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
    # a group still in a reader's hands at that moment (the agent's heartbeat reads every
    # group's sequence number 4 times a second) ends a moment later: wait up to 2 s for that
    deadline = time.monotonic() + 2
    while gloo_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"rank {os.environ['RANK']} gloo threads: {','.join(gloo_threads()) or 'none'}",
          flush=True)
    leave()


if __name__ == "__main__":
    main()
