"""A job that trains to its end and then does not exit, as users of Megatron, wandb-style loggers
and checkpoint uploaders report: torchrun's 2 ranks train STEPS steps (an all_reduce each), leave
their process group, print "training done", and return from their script; rank HOLD_RANK
(default 0, the rank that logs) then never ends, held by HOLD:

- ``thread``: a metrics uploader thread it started at the beginning, not a daemon, waits for
  records on a queue that nobody closes: Python waits for it before it exits;
- ``atexit``: an exit handler that syncs the checkpoints to a bucket waits for an answer that
  never comes;
- ``none``: nothing holds it (a healthy run)."""
import atexit
import os
import queue
import threading
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "5"))
HOLD = os.environ.get("HOLD", "none")
HOLD_RANK = int(os.environ.get("HOLD_RANK", "0"))
RECORDS: "queue.Queue[dict]" = queue.Queue()


def upload_metrics() -> None:
    """Sends each record to the tracking server; ends when it gets None (nobody sends it)."""
    while (record := RECORDS.get()) is not None:
        time.sleep(0.01 * len(record))


def sync_checkpoints_to_bucket() -> None:
    """Waits for the bucket to acknowledge the last checkpoint (it never does)."""
    threading.Event().wait()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    holds = rank == HOLD_RANK
    if holds and HOLD == "thread":
        threading.Thread(target=upload_metrics, name="metrics-uploader").start()
    if holds and HOLD == "atexit":
        atexit.register(sync_checkpoints_to_bucket)
    weights = torch.zeros(64)
    for step in range(STEPS):
        grad = torch.randn(64)
        dist.all_reduce(grad)
        weights -= 0.1 * grad / dist.get_world_size()
        RECORDS.put({"step": step, "norm": float(weights.norm())})
        if rank == 0:
            print(f"step {step}: norm {weights.norm():.3f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()
    print(f"rank {rank}: training done", flush=True)


if __name__ == "__main__":
    main()
