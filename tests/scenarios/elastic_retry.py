"""A job run by ``torchrun --max-restarts N``: on the first attempt (TORCHELASTIC_RESTART_COUNT
0) rank FAIL_RANK raises at step FAIL_STEP, torchrun's agent stops the other ranks and starts
every rank again; the second attempt trains to its end."""
import os
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "8"))
FAIL_RANK = int(os.environ.get("FAIL_RANK", "1"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "2"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.4"))


def main():
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    model = torch.nn.Linear(8, 8)
    for step in range(STEPS):
        if attempt == 0 and rank == FAIL_RANK and step == FAIL_STEP:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (rank {rank})")
        model(torch.randn(4, 8)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"attempt {attempt} rank {rank} step {step}", flush=True)
        time.sleep(STEP_SECONDS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
