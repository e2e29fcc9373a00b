"""A healthy DDP job (gloo) whose rank ABORT_RANK keeps a daemon thread working in torch to the
end, as a background weight-averaging (EMA) or metrics thread does: the training completes,
every collective returns, the process group is destroyed, and then, as the interpreter
finalizes, that thread comes back from torch's C++ (the GIL released inside), is ended through a
``noexcept`` frame and the rank dies with ``terminate called without an active exception``
(SIGABRT). The same exit race as gloo's own worker threads (pytorch/pytorch PR 179291), made
certain. STEPS steps; each rank prints "rank N done" after destroy_process_group."""
import os
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "4"))
ABORT_RANK = int(os.environ.get("ABORT_RANK", "0"))


def keep_ema(model: nn.Module, ready: threading.Event) -> None:
    """An exponential moving average of the weights, updated without pause in the background."""
    ema = [p.detach().clone() for p in model.parameters()]
    big = torch.randn(256, 256)
    ready.set()
    while True:
        with torch.no_grad():
            for avg, param in zip(ema, model.parameters()):
                avg.mul_(0.999).add_(param.detach(), alpha=0.001)
            big = torch.tanh(big @ big)   # torch's C++ with the GIL released


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == ABORT_RANK:
        ready = threading.Event()
        threading.Thread(target=keep_ema, args=(model.module, ready), daemon=True).start()
        ready.wait()
    for _ in range(STEPS):
        loss = model(torch.randn(16, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
