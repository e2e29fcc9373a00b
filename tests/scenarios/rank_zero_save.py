"""A collective under a rank-dependent branch: rank 0 saves a checkpoint and, inside that branch,
waits on ``dist.barrier()`` "until the checkpoint is written"; the other ranks never take the
branch and go on to the next step's gradient all-reduce. The training loop is the one of
PyTorch's tutorial "Writing Distributed Applications with PyTorch" (``average_gradients``: one
``all_reduce`` per parameter); the barrier-in-the-save-branch is the pattern behind
instructlab/training#566 and the save() barrier of KempnerForge#49, written on one rank only.

Environment: SAVE_STEP (default 2), STEPS (default 6).
"""
import os
import tempfile
import time

import torch
import torch.distributed as dist

SAVE_STEP = int(os.environ.get("SAVE_STEP", "2"))
STEPS = int(os.environ.get("STEPS", "6"))


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def save_checkpoint(model, step):
    with tempfile.TemporaryDirectory() as directory:
        torch.save({"model": model.state_dict(), "step": step}, f"{directory}/ckpt.pt")
        dist.barrier()   # "wait until the checkpoint is written" -- reached by rank 0 only


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 10)).pow(2).mean()
        loss.backward()
        average_gradients(model)
        optimizer.step()
        if rank == 0 and step == SAVE_STEP:
            save_checkpoint(model, step)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
