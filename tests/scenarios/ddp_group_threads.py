"""What a careful script's teardown leaves running: one DDP step (or, with MODEL=none, one plain
all_reduce), then the model and optimizer freed and collected, then ``destroy_process_group()``.
Each rank prints the names of its gloo threads left after that ("rank N gloo threads: ...").
On torch 2.13 a DDP model keeps references to its process group that freeing it does not
release, so the group's gloo threads outlive ``destroy_process_group()`` and live on into
interpreter exit, where torch's exit race can abort the rank (SD115's fix rests on this)."""
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from exit_race import leave


def gloo_threads() -> list[str]:
    names = (open(f"/proc/self/task/{tid}/comm").read().strip()
             for tid in os.listdir("/proc/self/task"))
    return sorted(name for name in names if "gloo" in name)


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    if os.environ.get("MODEL", "ddp") == "ddp":
        model = DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
    else:
        optimizer = None
        grads = torch.randn(8)
        dist.all_reduce(grads)
    model = optimizer = None
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
    print(f"rank {os.environ['RANK']} gloo threads: {','.join(gloo_threads()) or 'none'}",
          flush=True)
    leave()


if __name__ == "__main__":
    main()
