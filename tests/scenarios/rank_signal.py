"""At step SIGNAL_STEP rank SIGNAL_RANK sends itself SIGNAL (KILL or STOP), growing its memory
first when GROW_MB is set; the others go on to their next all_reduce."""
import os
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    hoard = []
    with_signal = getattr(signal, "SIG" + os.environ.get("SIGNAL", "KILL"))
    for step in range(int(os.environ.get("SIGNAL_STEP", "2")) + 3):
        if dist.get_rank() == int(os.environ.get("SIGNAL_RANK", "1")) and \
                step == int(os.environ.get("SIGNAL_STEP", "2")):
            hoard.append(bytearray(int(os.environ.get("GROW_MB", "0")) * 2**20))
            time.sleep(2.5)  # a few watcher ticks see the grown memory, even on a busy machine
            os.kill(os.getpid(), with_signal)
        dist.all_reduce(torch.ones(8))
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
