"""A rank that skips a batch alone after an exception it caught: DDP's gradient all-reduces go
out of step, and the job hangs at its end.

Sources, kept in structure and names:
- pytorch/pytorch#44353 "DDP training ... how to catch and handle the exception in training
  processes?": ``for i, (inputs, targets) in enumerate(train_loader): try: <forward and
  backprop> except RuntimeError as e: if 'out of memory' in str(e): print('| WARNING: ran out
  of memory, skipping this batch.'); optimizer.zero_grad() else: raise e`` -- "when one process
  catch the exception, the others get blocked" (mrshenli: skipping the communication after an
  OOM desyncs the collectives).
- NVIDIA-NeMo/Automodel#2468: DFlash's trainer raises ``NoValidAnchorsError`` when every sample
  of a micro-batch is too short; the loop caught it with a per-rank ``continue`` (no backward),
  so the gradient all-reduce mismatched and the job hung.
- Lightning-AI/pytorch-lightning#5243: "Ran out of memory in the backward pass. Skipping batch"
  logged right before the whole DDP job froze.

VARIANT "oom" (default): rank SKIP_RANK's forward raises ``RuntimeError("CUDA out of memory.
...")`` at step SKIP_STEP (a CPU box has no CUDA to run out of: the exception is raised where
the allocation would fail), caught as in #44353. VARIANT "anchors": the micro-batch of rank
SKIP_RANK at step SKIP_STEP has no valid anchor, ``NoValidAnchorsError`` is caught and the loop
``continue``s, as in Automodel#2468. Either way that rank runs one backward fewer; the others'
last gradient all-reduce waits for it while it sits in the barrier after the loop (before rank
0 writes the checkpoint). (With gloo, a metrics all-reduce there instead would crash on the size
mismatch rather than hang; NCCL does not check sizes.)

Environment: STEPS (default 6), SKIP_RANK (default 1), SKIP_STEP (default 2), VARIANT.
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("STEPS", "6"))
SKIP_RANK = int(os.environ.get("SKIP_RANK", "1"))
SKIP_STEP = int(os.environ.get("SKIP_STEP", "2"))
VARIANT = os.environ.get("VARIANT", "oom")


class NoValidAnchorsError(ValueError):
    """Every sample of the micro-batch is too short to form a block."""


class DraftHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, inputs):
        if inputs.shape[0] > 64:   # where a real GPU runs out of memory on a long batch
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
                               "79.15 GiB total capacity; 76.80 GiB already allocated)")
        return self.out(torch.relu(self.proj(inputs)))


def train_loader(rank):
    """Batches of this rank; SKIP_RANK's batch at SKIP_STEP is the awkward one."""
    for i in range(STEPS):
        awkward = rank == SKIP_RANK and i == SKIP_STEP
        rows = 96 if awkward and VARIANT == "oom" else 16
        lengths = torch.full((rows,), 1 if awkward and VARIANT == "anchors" else 12)
        yield torch.randn(rows, 8), torch.randn(rows, 1), lengths


def select_anchors(lengths, block=4):
    valid = lengths >= block
    if not bool(valid.any()):
        raise NoValidAnchorsError("no sample in the micro-batch is long enough for a block")
    return valid


def train(rank):
    model = DDP(DraftHead())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = torch.nn.MSELoss()
    total = 0.0
    for i, (inputs, targets, lengths) in enumerate(train_loader(rank)):
        if VARIANT == "anchors":
            try:
                select_anchors(lengths)
            except NoValidAnchorsError as err:
                print(f"rank {rank}: skipping micro-batch {i}: NoValidAnchorsError: {err}",
                      flush=True)
                continue
        try:
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            total += loss.item()
        except RuntimeError as e:
            if 'out of memory' in str(e):
                print('| WARNING: ran out of memory, skipping this batch.', flush=True)
                optimizer.zero_grad()
            else:
                raise e
        print(f"rank {rank} step {i}", flush=True)
        time.sleep(0.2)
    return total


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = train(rank)
    dist.barrier()   # every rank done before rank 0 writes the checkpoint
    if rank == 0:
        print(f"epoch loss {total:.4f}; saving", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
