"""A ZeRO-3-like loop whose ranks gather parameters every step; at step STUCK_STEP rank STUCK_RANK
goes into a user function (STUCK_FUNC) and never returns. The other ranks wait in the gather.

NCCL cannot run here, so each rank runs a stand-in for ProcessGroupNCCL's watchdog thread: when a
collective has been pending WATCHDOG_S seconds it prints the line torch 2.5-2.13 prints (the
sequence number is the process group's own, as NCCL's watchdog reports it, not the count of
Python calls), then takes the process down with SIGABRT as torch does.
"""
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

STUCK_RANK = int(os.environ.get("STUCK_RANK", "2"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "3"))
WATCHDOG_S = float(os.environ.get("WATCHDOG_S", "15"))
PENDING: dict[str, object] = {}


def watchdog(rank: int) -> None:
    """Stand-in for ProcessGroupNCCL's watchdog: one timeout line, then abort."""
    while True:
        time.sleep(0.1)
        entered = PENDING.get("at")
        if entered is None or time.monotonic() - entered < WATCHDOG_S:
            continue
        ms = int(WATCHDOG_S * 1000)
        now = datetime.datetime.now()
        stamp = f"E{now:%m%d %H:%M:%S.%f}"
        print(f"[rank{rank}]:[{stamp} {threading.get_native_id()} ProcessGroupNCCL.cpp:632] "
              f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective operation "
              f"timeout: WorkNCCL(SeqNum={PENDING['seq']}, OpType=_ALLGATHER_BASE, "
              f"NumelIn={PENDING['numel']}, NumelOut={PENDING['numel'] * dist.get_world_size()}, "
              f"Timeout(ms)={ms}) ran for {ms + 7} milliseconds before timing out.",
              file=sys.stderr, flush=True)
        os.abort()


def gather(shard: torch.Tensor) -> torch.Tensor:
    out = torch.empty(shard.numel() * dist.get_world_size())
    group = dist.distributed_c10d._get_default_group()
    PENDING.update(seq=group._get_sequence_number_for_group() + 1, numel=shard.numel(),
                   at=time.monotonic())
    dist.all_gather_into_tensor(out, shard)
    PENDING["at"] = None
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    threading.Thread(target=watchdog, args=(rank,), daemon=True).start()
    name = os.environ.get("STUCK_FUNC", "score_completions")

    def stuck() -> None:
        threading.Event().wait()

    stuck.__code__ = stuck.__code__.replace(co_name=name, co_qualname=name)
    layers = [torch.randn(64) for _ in range(4)]
    for step in range(STUCK_STEP + 3):
        if rank == STUCK_RANK and step == STUCK_STEP:
            stuck()
        for shard in layers:                 # forward: gather each layer's parameters
            gather(shard)
        dist.all_reduce(torch.ones(8))       # loss scale, once per step
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
