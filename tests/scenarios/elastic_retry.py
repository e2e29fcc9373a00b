"""A job run by ``torchrun --max-restarts N``: on the first attempt (TORCHELASTIC_RESTART_COUNT
0) rank FAIL_RANK raises at step FAIL_STEP (a negative step: while loading its checkpoint shard,
before it joins the process group), torchrun's agent stops the other ranks and starts every rank
again; the second attempt trains to its end. (A failure after the ranks joined makes the second
attempt's gloo rendezvous fail or hang about half the time with torch 2.13 alone, stalldoc or
not: it connects to the first attempt's addresses.)

With HANG_STEP, in the restarted attempt rank FAIL_RANK blocks in its data loader at that step
(a prefetch queue nobody fills), while the other ranks wait in the step's all_reduce. With
SLOW_STEP it is slow there instead: SLOW_SECONDS (default 8) of augmentation on the CPU."""
import os
import queue
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("STEPS", "8"))
FAIL_RANK = int(os.environ.get("FAIL_RANK", "1"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "2"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.4"))
HANG_STEP = int(os.environ.get("HANG_STEP", "-1"))
SLOW_STEP = int(os.environ.get("SLOW_STEP", "-1"))
SLOW_SECONDS = float(os.environ.get("SLOW_SECONDS", "8"))


def load_checkpoint_shard(rank, attempt):
    """Each rank reads its shard (LOAD_SECONDS); FAIL_RANK's read fails on the first attempt,
    before any rank joined the group (torchrun stops the others while they still read)."""
    if attempt == 0 and rank == FAIL_RANK and FAIL_STEP < 0:
        raise OSError(f"Stale file handle: /nfs/ckpt/shard-{rank}.pt (rank {rank})")
    time.sleep(float(os.environ.get("LOAD_SECONDS", "0")) if attempt == 0 else 0)


def augment_batch(seconds):
    """Rank FAIL_RANK's augmentation after the restart, on the CPU, for ``seconds``: slow, not
    hung (its cache of augmented shards went with the first attempt)."""
    end, x = time.monotonic() + seconds, torch.randn(64, 64)
    while time.monotonic() < end:
        x = torch.tanh(x @ x.T / 64)
    return x


def next_batch(rank, attempt, step, prefetched):
    """The data loader's next batch: after a restart, rank FAIL_RANK's prefetch worker is gone
    and its queue is never filled again."""
    if attempt > 0 and rank == FAIL_RANK and step == HANG_STEP:
        return prefetched.get()
    if attempt > 0 and rank == FAIL_RANK and step == SLOW_STEP:
        augment_batch(SLOW_SECONDS)
    return torch.randn(4, 8)


def main():
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    load_checkpoint_shard(rank, attempt)
    dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 8)
    prefetched = queue.Queue()
    for step in range(STEPS):
        if attempt == 0 and rank == FAIL_RANK and step == FAIL_STEP:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (rank {rank})")
        model(next_batch(rank, attempt, step, prefetched)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        print(f"attempt {attempt} rank {rank} step {step}", flush=True)
        time.sleep(STEP_SECONDS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
