"""A DataLoader worker deadlocked after fork on a lock copied while held.

On Linux the DataLoader forks its workers; a lock that another thread of the rank holds at that
moment is copied locked into each worker, where no thread will ever release it. The reports:
pytorch/pytorch#130610 ("dataloader hangs with fork and pin memory=True": the pin-memory thread
holds a lock in ``__cxa_atexit`` as a worker is forked), ultralytics/ultralytics#26085 (image
decoder locks inherited by forked loader workers), and RolnickLab/ami-data-companion#140 (the
parent's py-spy dump: ``_try_get_data`` in ``queue.get``, forever). Here the lock is the rank's
tokenizer cache lock, held by a cache-refresh thread while the epoch's iterator forks its
workers: on STUCK_RANK only, at epoch STUCK_EPOCH. That rank waits in the DataLoader for a batch
that never comes; the others wait in the gradient all_reduce.

Environment: STUCK_RANK (default 1), STUCK_EPOCH (default 1), WORKERS (default 2).
"""
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

STUCK_RANK = int(os.environ.get("STUCK_RANK", "1"))
STUCK_EPOCH = int(os.environ.get("STUCK_EPOCH", "1"))
WORKERS = int(os.environ.get("WORKERS", "2"))
CACHE_LOCK = threading.Lock()
TOKEN_CACHE = {}


def tokenize(text):
    with CACHE_LOCK:                    # a forked worker that inherited it locked waits here
        if text not in TOKEN_CACHE:
            TOKEN_CACHE[text] = [ord(c) % 32 for c in text[:8]]
        return TOKEN_CACHE[text]


class PromptDataset(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        ids = tokenize(f"prompt number {index:04d}")
        return torch.tensor(ids + [0] * (8 - len(ids)), dtype=torch.float32)


def refresh_cache(holding):
    with CACHE_LOCK:                    # the refresh holds the lock for a while
        TOKEN_CACHE.clear()
        holding.set()
        time.sleep(2.0)


def train():
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    loader = DataLoader(PromptDataset(), batch_size=4, num_workers=WORKERS)
    for epoch in range(3):
        if rank == STUCK_RANK and epoch == STUCK_EPOCH:
            holding = threading.Event()
            threading.Thread(target=refresh_cache, args=(holding,), daemon=True).start()
            holding.wait()              # the workers are forked while the refresh holds it
        for batch in loader:
            loss = model(batch).pow(2).mean()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
        print(f"rank {rank} epoch {epoch} done", flush=True)


def main():
    dist.init_process_group("gloo")
    train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
