"""Rank 0 writes a checkpoint to a filesystem that stops answering; the others wait in a barrier

source: https://github.com/microsoft/DLWorkspace/issues/484, https://github.com/longhorn/longhorn/issues/4772
shape: a 4-rank DDP job (torchrun, gloo) where rank 0 alone saves the model with torch.save to a
  network mount every 8 steps, then every rank meets in dist.barrier(); the mount hangs (NFS server
  gone: open() never returns). No NFS here: the stand-in is a checkpoint path that is a FIFO no
  process reads, so rank 0 blocks in open() the way it blocks on the hung mount
launch: torchrun 4
truth: hang
culprit: 0
frame: save_checkpoint
cause: io_wait
needs: torch
"""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

MOUNT = Path("mnt/nfs-ckpt")


def mount_checkpoint_volume() -> None:
    """Stand-in for the NFS mount whose server stops answering after the first save."""
    MOUNT.mkdir(parents=True, exist_ok=True)
    os.mkfifo(MOUNT / "step_00016.pt")


def save_checkpoint(model, optimizer, step: int) -> None:
    path = MOUNT / f"step_{step:05d}.pt"
    if step == 16:
        jobkit.hang_begins("rank 0 writes its checkpoint to a mount that stopped answering")
    torch.save({"step": step, "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict()}, path)
    print(f"saved {path}", flush=True)


def main() -> None:
    rank, world = jobkit.init()
    if rank == 0:
        mount_checkpoint_volume()
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Embedding(128, 32), torch.nn.Flatten(), torch.nn.Linear(8 * 32, 128)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(1, 41):
        tokens = torch.randint(0, 128, (8, 8))
        loss = torch.nn.functional.cross_entropy(model(tokens), tokens[:, 0])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        if step % 8 == 0:
            if rank == 0:
                save_checkpoint(model, optimizer, step)
            dist.barrier()
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
