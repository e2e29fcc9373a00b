"""One rank catches an out-of-memory error, skips its backward, and goes on to the stats all-gather

source: https://github.com/facebookresearch/fairseq/pull/3989
shape: a fairseq-style DDP trainer (2 spawned ranks) whose train_step catches "out of memory",
  zeroes the grads and skips the batch, then gathers logging stats with all_gather_list; at step 3
  rank 1's forward raises the OOM, so it sits in all_gather_list while rank 0's backward waits in
  the gradient all-reduce
launch: spawn 2
truth: hang
culprit: 1
frame: all_gather_list
cause: collective_mismatch
needs: torch
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class TransformerBlock(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(width, 4, batch_first=True)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.ffn(x)


def all_gather_list(stats: dict) -> list[dict]:
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, stats)
    return gathered


def train_step(model, optimizer, batch: torch.Tensor) -> dict:
    try:
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": float(loss.detach()), "ooms": 0}
    except RuntimeError as error:
        if "out of memory" not in str(error):
            raise
        print(f"| WARNING: ran out of memory on rank {dist.get_rank()}, skipping batch", flush=True)
        optimizer.zero_grad()
        jobkit.hang_begins("rank 1 swallowed an OOM and skipped its backward: it goes on to "
                           "all_gather_list, rank 0 is in the gradient all-reduce")
        return {"loss": 0.0, "ooms": 1}


def main(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(0)
    block = TransformerBlock()
    state = {"step": 0}

    def long_batch_oom(module, inputs):
        if rank == 1 and state["step"] == 3:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB "
                               "total capacity; 77.02 GiB already allocated)")
    block.ffn.register_forward_pre_hook(long_batch_oom)
    model = DistributedDataParallel(block)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    for step in range(30):
        state["step"] = step
        stats = train_step(model, optimizer, torch.randn(4, 12, 32))
        logs = all_gather_list(stats)
        jobkit.step(step)
        if rank == 0:
            print(f"step {step} loss {sum(s['loss'] for s in logs) / world:.4f} "
                  f"ooms {sum(s['ooms'] for s in logs)}", flush=True)
        time.sleep(0.3)


if __name__ == "__main__":
    jobkit.spawn(main, 2)
