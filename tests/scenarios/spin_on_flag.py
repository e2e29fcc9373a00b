"""A livelock: at step 2, rank SPIN_RANK spins on a flag that another thread was meant to set
(the thread died first), burning a core on one line, while the other ranks wait in all_reduce."""
import os
import threading
import time

import torch
import torch.distributed as dist

READY = {"value": False}


def _set_ready_when_loaded() -> None:
    raise FileNotFoundError("/nonexistent/tokenizer.json")   # dies before setting the flag


def wait_until_tokenizer_ready() -> None:
    while not READY["value"]: pass  # noqa: E701


def main() -> None:
    dist.init_process_group("gloo")
    spin_rank = int(os.environ.get("SPIN_RANK", "1"))
    for step in range(5):
        if step == 2 and dist.get_rank() == spin_rank:
            threading.Thread(target=_set_ready_when_loaded, daemon=True).start()
            wait_until_tokenizer_ready()
        dist.all_reduce(torch.ones(16))
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
