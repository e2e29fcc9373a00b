"""Distributed evaluation that all-gathers each rank's predictions, whose count differs per rank.

Sources, kept in structure and names:
- pytorch/ignite#1569 "How to all_gather Tensor if not the same length": ``preds`` and
  ``labels`` on different GPUs do not have the same length (GPU0 has 5 images, GPU1 has 4,
  total 9), so ``all_gather()`` cannot work.
- Lightning-AI/pytorch-lightning#7773: ``all_gather`` of tensors of different lengths on
  different devices "freezes and GPU spikes to 100%", with no error.
- huggingface/accelerate#167: predictions of sentences padded per batch, gathered for
  logging: stuck.

The eval set (IMAGES records, default 9) is sharded ``records[rank::world]``; each rank predicts
its shard and calls ``dist.all_gather(gathered, preds)`` with ``gathered`` shaped like its own
``preds``. Under NCCL that hangs or mixes data; gloo checks the sizes and aborts the rank that
receives more than it expected ("Is there a distributed collective mismatch in your code?").

Environment: IMAGES (default 9).
"""
import os

import torch
import torch.distributed as dist

IMAGES = int(os.environ.get("IMAGES", "9"))


def predict(model, rank, world):
    images = torch.randn(IMAGES, 3 * 8 * 8)[rank::world]
    with torch.no_grad():
        return model(images).argmax(dim=-1)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 8 * 8, 10)
    preds = predict(model, rank, world)
    print(f"rank {rank}: {preds.numel()} predictions", flush=True)
    gathered = [torch.zeros_like(preds) for _ in range(world)]
    dist.all_gather(gathered, preds)
    if rank == 0:
        print(f"accuracy over {sum(g.numel() for g in gathered)} images", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
