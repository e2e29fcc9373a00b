"""Rank DEADLOCK_RANK deadlocks on two locks taken in opposite order by its main thread and a
helper thread; the other ranks wait for it in all_reduce."""
import os
import threading
import time

import torch
import torch.distributed as dist

lock_a = threading.Lock()
lock_b = threading.Lock()


def helper() -> None:
    with lock_b:
        time.sleep(0.5)
        with lock_a:
            pass


def update_cache() -> None:
    with lock_a:
        time.sleep(0.5)
        with lock_b:
            pass


def main() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == int(os.environ.get("DEADLOCK_RANK", "0")):
        threading.Thread(target=helper, name="cache-writer", daemon=True).start()
        update_cache()
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
