"""Healthy: co-located trainer ranks and a generator oversubscribe the CPU; one long step takes a minute

source: https://github.com/pytorch/torchtitan/issues/4038
shape: an RL-style job on one host: two DDP trainer ranks started with torch.multiprocessing.spawn
  (gloo) and a co-located rollout generator process; each sizes its intra-op thread pool to
  every host core (torch.set_num_threads(os.cpu_count())), so 3 processes x all cores thrash on
  2 cores; a long-context optimizer step (many accumulated micro-batches) takes over a minute
  between heartbeats while every process is busy and the all-reduces complete. Its micro-batch
  count is sized from the warmup steps' measured pace (all ranks agree through an all-reduce) so
  the step lasts ~75 s however loaded this shared machine is. Slow, not stuck
launch: spawn 2
truth: healthy
needs: torch
budget: 200
"""
import multiprocessing
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

LONG_STEP_SECONDS = 75


def generate_rollouts(stop) -> None:
    jobkit.announce("generator")
    torch.set_num_threads(os.cpu_count())
    policy = torch.randn(1024, 1024) / 32
    state, produced = torch.randn(256, 1024), 0
    while not stop.is_set():
        for _ in range(8):
            state = torch.tanh(state @ policy)
        produced += state.shape[0]
    print(f"generator: {produced} rollout tokens", flush=True)


def train_step(model, optimizer, micro_batches: int) -> float:
    optimizer.zero_grad()
    for number in range(micro_batches):
        x = torch.randn(512, 1024)
        if number < micro_batches - 1:
            with model.no_sync():
                model(x).pow(2).mean().backward()
        else:
            loss = model(x).pow(2).mean()
            loss.backward()
    optimizer.step()
    return loss.item()


def train(rank: int, world: int) -> None:
    torch.set_num_threads(os.cpu_count())
    jobkit.init(rank=rank, world=world)
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1024)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(6):
        if step == 2:
            began = time.time()
        loss = train_step(model, optimizer, micro_batches=2)
        jobkit.step(step)
    pace = torch.tensor([(time.time() - began) / 8])          # seconds per micro-batch
    dist.all_reduce(pace, op=dist.ReduceOp.MAX)
    micro_batches = int(min(400, max(16, LONG_STEP_SECONDS / float(pace))))
    if rank == 0:
        jobkit.hang_begins(f"the long-context step: {micro_batches} micro-batches, oversubscribed CPU")
    began = time.time()
    loss = train_step(model, optimizer, micro_batches=micro_batches)
    jobkit.step(6)
    if rank == 0:
        print(f"long-context step ({micro_batches} micro-batches) took {time.time() - began:.0f}s, "
              f"loss {loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    stop = multiprocessing.Event()
    generator = multiprocessing.Process(target=generate_rollouts, args=(stop,))
    generator.start()
    jobkit.spawn(train, 2)
    stop.set()
    generator.join()
