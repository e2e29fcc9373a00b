"""Ranks train a few DDP-like steps and leave their world (destroy_process_group); every rank
but SLOW_RANK (default 0) then exits at once, while SLOW_RANK's process takes EXIT_SECONDS
(default 8) to end: its main thread is gone (the process's leader is a zombie) while one native
thread is still at work on the way out, the kernel state of a large process being torn down (the
last thread frees gigabytes of memory, or a driver's teardown waits for the device). Made here
with the main thread calling pthread_exit, so that its last thread, not the interpreter, decides
when the process ends: after EXIT_SECONDS, with status 0. A healthy job."""
import ctypes
import os
import threading
import time

import torch
import torch.distributed as dist


def teardown(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(0)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        grads = torch.randn(1024)
        dist.all_reduce(grads)
        time.sleep(0.1)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    if rank == int(os.environ.get("SLOW_RANK", "0")):
        threading.Thread(target=teardown, args=(float(os.environ.get("EXIT_SECONDS", "8")),),
                         daemon=True).start()
        ctypes.CDLL(None).pthread_exit(None)   # the GIL is released around a ctypes call


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
