"""Resuming from a checkpoint that only some ranks see: the hang of KempnerForge#49 ("Race in
CheckpointManager save and load collectives"). ``load()`` calls ``train_state_path.exists()`` on
every rank; on a distributed file system the answers can disagree for a while (attribute
caching), so the ranks that see the file enter the branch that reads ``train_state.pt`` and
broadcasts it (``broadcast_object_list``), while the others skip it and start training: their
first DDP gradient all-reduce meets the broadcast, and neither ever completes.

Emulated without a shared file system: the ranks in SEES (comma list, default "0") look at the
directory where the checkpoint was written, the others at one their view does not show yet.

Environment: SEES (default "0"), CKPT_DIR (required: a directory the test owns).
"""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SEES = {int(r) for r in os.environ.get("SEES", "0").split(",")}
CKPT_DIR = Path(os.environ["CKPT_DIR"])


class CheckpointManager:
    def __init__(self, rank):
        # what this rank's view of the shared directory shows
        self.root = CKPT_DIR / ("written" if rank in SEES else "stale-view")
        self.rank = rank

    def train_state_path(self):
        return self.root / "latest" / "train_state.pt"

    def load(self, model):
        train_state_path = self.train_state_path()
        if train_state_path.exists():
            state = [torch.load(train_state_path) if self.rank == min(SEES) else None]
            dist.broadcast_object_list(state, src=min(SEES))
            model.module.load_state_dict(state[0]["model"])
            return state[0]["step"]
        return 0


def write_checkpoint():
    latest = CKPT_DIR / "written" / "latest"
    latest.mkdir(parents=True, exist_ok=True)
    torch.save({"model": torch.nn.Linear(8, 1).state_dict(), "step": 100},
               latest / "train_state.pt")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        write_checkpoint()
    dist.barrier()
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = CheckpointManager(rank).load(model)
    for step in range(step, step + 5):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        time.sleep(0.2)
    print(f"rank {rank} finished at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
