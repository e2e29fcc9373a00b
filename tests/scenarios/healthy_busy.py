"""A healthy job: a few steps, then one long compute phase on every rank (pure-Python arithmetic,
longer than the stall timeout, CPU busy and the stack moving), then more steps; exits 0."""
import os
import time

import torch
import torch.distributed as dist

import stalldoc


def long_compute(seconds: float) -> float:
    total, end = 0.0, time.time() + seconds
    while time.time() < end:
        for i in range(1000):
            total += (i * 0.5) % 7
        total = total % 1000
    return total


def main() -> None:
    dist.init_process_group("gloo")
    busy = float(os.environ.get("BUSY_SECONDS", "8"))
    for step in range(6):
        with stalldoc.phase("step"):
            if step == 2:
                with stalldoc.phase("evaluate"):
                    long_compute(busy)
            dist.all_reduce(torch.ones(8))
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
