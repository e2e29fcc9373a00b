"""An async checkpoint's background thread and the main thread's barrier race on one process group

source: https://github.com/KempnerInstitute/KempnerForge/issues/104
shape: a torchtitan-style 2-rank DDP trainer (torchrun, gloo) whose CheckpointManager.save calls
  torch.distributed.checkpoint.async_save on the default group and then, from the main thread,
  its end-of-save dist.barrier() on that same group, at back-to-back steps; the save planning's
  collectives run on the AsyncCheckpointExecutor thread, and the two ranks issue the two threads'
  collectives in different orders
launch: torchrun 2
truth: hang
culprit: 0, 1
frame: save
cause: collective_mismatch
needs: torch
"""
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

import jobkit


class CheckpointManager:
    def __init__(self, folder: Path, model, optimizer) -> None:
        self.folder, self.model, self.optimizer = folder, model, optimizer
        self.pending = None

    def state_dict(self) -> dict:
        return {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def save(self, step: int) -> None:
        if step == 4:
            jobkit.hang_begins("back-to-back async saves: background collectives race the barrier")
        self.pending = dcp.async_save(self.state_dict(), checkpoint_id=self.folder / f"step-{step}")
        if dist.get_rank() == 0:
            time.sleep(0.3)                  # rank 0 logs the save before the barrier
        dist.barrier()


def main() -> None:
    rank, world = jobkit.init()
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 64)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoints = CheckpointManager(Path("checkpoints").resolve(), model, optimizer)
    for step in range(1, 21):
        loss = model(torch.randn(8, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        if step >= 4:
            checkpoints.save(step)           # checkpoint.interval = 1 while debugging resumption
        time.sleep(0.2)
    checkpoints.pending.result()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
