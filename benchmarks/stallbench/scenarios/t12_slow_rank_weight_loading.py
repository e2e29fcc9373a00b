"""Healthy: one rank loads and post-processes a 10x larger weight shard while the other waits

source: https://github.com/sgl-project/sglang/pull/39128, https://github.com/ROCm/ATOM/pull/1465
shape: an inference engine started with torch.multiprocessing.spawn, 2 ranks on gloo; each
  rank loads its own expert shard from safetensors files and runs post_load_weights
  (per-row int8 re-quantization) before dist.monitored_barrier(timeout=10 min); the expert
  placement gives rank 1 ten times the experts, so rank 1 needs ~90 s while rank 0 is done in
  ~9 s. The shard files are read at a paced rate (a slow shared filesystem). Slow, not stuck
launch: spawn 2
truth: healthy
needs: torch, safetensors
budget: 150
"""
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

import jobkit

CHECKPOINT = Path(os.path.expanduser("~/.cache/stallbench/t12-moe-checkpoint"))
EXPERTS = {0: range(0, 6), 1: range(6, 66)}         # the expert placement: rank 1 holds 60
READ_SECONDS_PER_EXPERT = 1.2                         # the shared filesystem's pace


def prepare_checkpoint() -> None:
    if (CHECKPOINT / "done").exists():
        return
    CHECKPOINT.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for expert in range(66):
        save_file({"w_in": torch.randn(256, 128, generator=generator),
                   "w_out": torch.randn(128, 256, generator=generator)},
                  CHECKPOINT / f"expert-{expert:03d}.safetensors")
    (CHECKPOINT / "done").write_text("66")


def load_weights(rank: int) -> dict[str, torch.Tensor]:
    weights = {}
    for expert in EXPERTS[rank]:
        began = time.time()
        with safe_open(CHECKPOINT / f"expert-{expert:03d}.safetensors", "pt") as shard:
            for name in shard.keys():
                weights[f"experts.{expert}.{name}"] = shard.get_tensor(name)
        time.sleep(max(0.0, READ_SECONDS_PER_EXPERT - (time.time() - began)))
    return weights


def post_load_weights(weights: dict[str, torch.Tensor]) -> dict[str, tuple]:
    packed = {}
    for number, (name, tensor) in enumerate(weights.items()):
        scale = tensor.abs().amax(dim=1, keepdim=True) / 127
        packed[name] = ((tensor / scale).round().clamp(-127, 127).to(torch.int8), scale)
        if number % 20 == 0:
            print(f"post_load_weights: {number}/{len(weights)}", flush=True)
    return packed


def serve(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    if rank == 1:
        jobkit.hang_begins("rank 1 loads a 10x larger expert shard; rank 0 waits in the barrier")
    experts = post_load_weights(load_weights(rank))
    dist.monitored_barrier(timeout=timedelta(minutes=10))
    for step in range(10):
        hidden = torch.randn(4, 128)
        for name, (q, scale) in experts.items():
            if name.endswith("w_out"):
                weight = q.float() * scale
                hidden = torch.tanh(hidden @ weight @ weight.T / 256)
        dist.all_reduce(hidden)
        jobkit.step(step)
    print(f"rank {rank}: served {len(experts)} expert tensors", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    prepare_checkpoint()
    jobkit.spawn(serve, 2)
