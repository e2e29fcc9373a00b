"""A data-parallel loop across nodes: each step every rank loads its shard of the batch from the
shared filesystem, computes, and all-reduces its gradients. At step STUCK_STEP global rank
STUCK_RANK opens a shard that hangs (a FIFO with no writer: what a stuck NFS or Lustre mount
looks like from Python, blocked in open() with no CPU) and the other ranks, on every node, wait
for it in all_reduce. Writing to the FIFO releases it; the loop then finishes. With SLOW_RANK
instead, that rank scores its rollouts on the CPU for SLOW_SECONDS at STUCK_STEP (a reward
function that is slow, not stuck) while the others wait."""
import os
import time

import torch
import torch.distributed as dist

STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "3"))
STEPS = int(os.environ.get("STEPS", "6"))
SHARDS = os.environ["SHARD_DIR"]
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "0"))


def score_rollouts(seconds: float) -> float:
    """A reward function that takes its time: pure Python on the CPU."""
    total, end = 0.0, time.time() + seconds
    while time.time() < end:
        total += sum(i * i for i in range(2000)) % 7
    return total


def load_shard(step: int, rank: int) -> torch.Tensor:
    path = os.path.join(SHARDS, f"shard-{step}-{rank}.bin")
    if rank == STUCK_RANK and step == STUCK_STEP:
        path = os.environ["STUCK_SHARD"]
    with open(path, "rb") as fh:
        data = fh.read(4096)
    return torch.frombuffer(bytearray(data.ljust(64, b"\0")[:64]), dtype=torch.float32).clone()


def train_step(batch: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    grad = torch.tanh(batch @ weight) * 0.01
    dist.all_reduce(grad)
    return weight - grad


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    weight = torch.ones(16, 16)
    for step in range(STEPS):
        with open(os.path.join(SHARDS, f"shard-{step}-{rank}.bin"), "wb") as fh:
            fh.write(os.urandom(64))
        batch = load_shard(step, rank).reshape(1, 16).repeat(16, 1)
        if rank == SLOW_RANK and step == STUCK_STEP:
            score_rollouts(SLOW_SECONDS)
        weight = train_step(batch, weight)
        print(f"rank {rank} step {step} done", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
