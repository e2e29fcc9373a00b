"""Colocated rollouts with a (stand-in) vLLM engine per rank: each step generates, puts the
engine to sleep to train, and wakes it again; at step 2, rank WAIT_RANK skips the wake-up (the
bug) and its next generate waits for an engine that never produces; the others wait in the
all_reduce."""
import logging
import os
import time

import torch
import torch.distributed as dist
from vllm import LLM

WAIT_RANK = int(os.environ.get("WAIT_RANK", "0"))
logging.basicConfig(level=logging.INFO, format="INFO %(asctime)s [abstract.py] %(message)s",
                    datefmt="%m-%d %H:%M:%S")


def rollout(llm: LLM) -> list:
    return llm.generate(["2+2?", "3+3?"])


def main() -> None:
    dist.init_process_group("gloo")
    llm = LLM("tiny", enable_sleep_mode=True)
    for step in range(5):
        rollout(llm)
        llm.sleep(level=1)
        dist.all_reduce(torch.ones(8))     # the training step, with vLLM asleep
        if not (step == 2 and dist.get_rank() == WAIT_RANK):
            llm.wake_up()
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
