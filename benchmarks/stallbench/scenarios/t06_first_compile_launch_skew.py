"""Healthy: rank 1 compiles the model cold for a minute or more while rank 0, warm, waits in the first all-reduce

source: https://github.com/karpathy/nanochat/pull/722, https://github.com/pytorch/pytorch/issues/108971
shape: a 2-rank DDP job over a torch.compile'd small transformer (inductor, C++ codegen on CPU):
  rank 0 finds its kernels in a warm inductor cache, rank 1 starts with an empty one
  (TORCHINDUCTOR_CACHE_DIR per rank) and compiles forward and backward before its first step;
  rank 0's first backward waits in DDP's gradient all-reduce meanwhile; then both train
launch: torchrun 2
truth: healthy
needs: torch
budget: 240
"""
import os
import shutil
import time
from pathlib import Path

RANK = int(os.environ.get("RANK", "0"))
WARM_CACHE = Path.home() / ".cache" / "stallbench" / "t06-inductor-cache"
COLD_CACHE = Path.cwd() / f"inductor-cache-rank{RANK}"
# rank 0's node ran this job before (warm kernels); rank 1's node is fresh
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(WARM_CACHE if RANK == 0 else COLD_CACHE)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import jobkit  # noqa: E402


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 256, width: int = 64, layers: int = 12) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(   # a widening feed-forward per block: no two alike
            torch.nn.TransformerEncoderLayer(width, 4, 2 * width + 24 * i, dropout=0.0,
                                             batch_first=True, norm_first=True) for i in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train_step(model, optimizer, tokens: torch.Tensor) -> float:
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def main() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(0)
    model = torch.compile(DistributedDataParallel(TinyLM()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    started = time.time()
    for step in range(30):
        if step == 0:
            jobkit.hang_begins("the first step compiles: rank 1 cold, rank 0 warm and waiting")
        loss = train_step(model, optimizer, torch.randint(0, 256, (8, 33)))
        jobkit.step(step)
        if step == 0:
            print(f"rank {rank}: first step done after {time.time() - started:.1f} s", flush=True)
        elif step % 10 == 0 and rank == 0:
            print(f"step {step} loss {loss:.3f}", flush=True)
    dist.destroy_process_group()
    if rank != 0:
        shutil.rmtree(COLD_CACHE, ignore_errors=True)


if __name__ == "__main__":
    main()
