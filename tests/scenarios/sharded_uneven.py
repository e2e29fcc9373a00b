"""Uneven inputs, the classic DDP hang: each rank reads its own shard of the records
(``records[rank::world]``), so when their count is not a multiple of the world size the first
ranks get one batch more.

Sources, kept in structure and names:
- PyTorch's tutorial "Distributed Training with Uneven Inputs Using the Join Context Manager":
  a DDP model, ``num_inputs`` differing per rank, ``loss = model(input).sum(); loss.backward()``
  in the loop; without ``Join`` it hangs.
- Lightning-AI/pytorch-lightning#20404 "How to deal with uneven inputs in DDP with sharded data
  without hanging": an IterableDataset sharded per rank with different lengths.
- pytorch/pytorch#38174 (the RFC of ``join()``): the ranks that run out of data wait in the
  next collective, the others in DDP's gradient all-reduce in ``backward()``.

After its loop every rank runs AFTER: "barrier" (a final ``dist.barrier()``) or
"all_gather_object" (gathering the epoch's metrics, as evaluation code does). The ranks with
fewer batches wait in it; those with one more wait in DDP's all-reduce inside backward().

Environment: RECORDS (default 9), AFTER (default "barrier"), STEP_SECONDS (default 0.2).
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

RECORDS = int(os.environ.get("RECORDS", "9"))
AFTER = os.environ.get("AFTER", "barrier")
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.2"))


class ShardedRecords(IterableDataset):
    """This rank's records: every world-th one, starting at its rank."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def __iter__(self):
        for index in range(self.rank, RECORDS, self.world):
            yield torch.full((4,), float(index))


def train(rank, world):
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 0
    for inputs in DataLoader(ShardedRecords(rank, world), batch_size=1):
        optimizer.zero_grad()
        loss = model(inputs).sum()
        loss.backward()
        optimizer.step()
        batches += 1
        time.sleep(STEP_SECONDS)
    print(f"rank {rank} trained {batches} batches", flush=True)
    return batches


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = train(rank, world)
    if AFTER == "barrier":
        dist.barrier()
    else:
        metrics = [None] * world
        dist.all_gather_object(metrics, {"rank": rank, "batches": batches})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
