"""Healthy: rank 0 writes a sharded checkpoint for ~90 s while the others wait in gathers and a barrier

source: https://github.com/ServiceNow/Fast-LLM/pull/543
shape: a 3-rank torchrun DDP job (gloo) whose checkpoint save is rank-0-serialized: for each
  shard all ranks gather the shard's tensors to rank 0, which writes a safetensors file to slow
  networked storage, then every rank meets in dist.barrier(); the stand-in for the slow storage
  is a write paced to ~0.5 MB/s with an fsync per chunk. Slow, not stuck
launch: torchrun 3
truth: healthy
needs: torch, safetensors
budget: 150
"""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save
from torch.nn.parallel import DistributedDataParallel

import jobkit

CHUNK = 256 * 1024
STORAGE_BYTES_PER_SECOND = 512 * 1024


def write_to_storage(path: Path, payload: bytes) -> None:
    with open(path, "wb") as out:
        for start in range(0, len(payload), CHUNK):
            began = time.time()
            out.write(payload[start:start + CHUNK])
            out.flush()
            os.fsync(out.fileno())
            time.sleep(max(0.0, CHUNK / STORAGE_BYTES_PER_SECOND - (time.time() - began)))


def save_checkpoint(model: torch.nn.Module, folder: Path, rank: int, world: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = [name for name, _ in model.named_parameters()]
    shards = [names[i::3] for i in range(3)]
    for index, shard in enumerate(shards):
        tensors = {}
        for name in shard:
            local = dict(model.named_parameters())[name].detach().contiguous()
            gathered = [torch.empty_like(local) for _ in range(world)] if rank == 0 else None
            dist.gather(local, gathered, dst=0)
            if rank == 0:
                tensors[name] = torch.stack(gathered).mean(0)
        if rank == 0:
            write_to_storage(folder / f"model-{index + 1:05d}-of-00003.safetensors", save(tensors))
            print(f"wrote shard {index + 1}/3", flush=True)
    dist.barrier()


def main() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(1, 21):
        loss = model(torch.randn(4, 512)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        if step == 10:
            if rank == 0:
                jobkit.hang_begins("rank 0 writes the checkpoint shards; the others wait")
            save_checkpoint(model.module, Path("checkpoints/step_10"), rank, world)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
