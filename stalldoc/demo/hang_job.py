"""Demo training job: a few steps of data loading and gradient all_reduce; then one rank blocks
in its data loader (think: a read from a network mount that stopped answering) while the others
wait for it in all_reduce. DEMO_HANG_SECONDS: how long the read blocks before it returns and the
job runs to its end (unset: forever, a dead mount)."""
import os
import time

import torch
import torch.distributed as dist

import stalldoc

HANG_RANK = int(os.environ.get("DEMO_HANG_RANK", "1"))
HANG_STEP = int(os.environ.get("DEMO_HANG_STEP", "3"))
HANG_SECONDS = float(os.environ.get("DEMO_HANG_SECONDS", "inf"))


def load_shard(step: int) -> torch.Tensor:
    if dist.get_rank() == HANG_RANK and step == HANG_STEP:
        answered = time.monotonic() + HANG_SECONDS
        while time.monotonic() < answered:
            time.sleep(0.5)
    return torch.randn(32, 64)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Linear(64, 64)
    for step in range(HANG_STEP + 5):
        with stalldoc.phase("data"):
            batch = load_shard(step)
        with stalldoc.phase("step"):
            model(batch).pow(2).mean().backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
