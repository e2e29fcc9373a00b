"""Ranks train a few steps; then every rank but 0 is done and exits 0 (it wrote nothing more),
while rank 0 alone runs a final evaluation for EVAL_SECONDS and then exits 0. Nobody calls
destroy_process_group, as many scripts do not. A healthy job: no rank's exit is a failure."""
import os
import time

import torch
import torch.distributed as dist


def final_evaluation(seconds: float) -> float:
    end, acc = time.monotonic() + seconds, torch.zeros(256, 256)
    while time.monotonic() < end: acc = acc @ torch.eye(256) + 1e-3  # noqa: E701
    return float(acc.mean())


def main() -> None:
    dist.init_process_group("gloo")
    for step in range(3):
        grads = torch.randn(1024)
        dist.all_reduce(grads)
        time.sleep(0.1)
    if dist.get_rank() == 0:
        print(f"final eval {final_evaluation(float(os.environ.get('EVAL_SECONDS', '6'))):.3f}",
              flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
