"""torch.distributed.breakpoint(rank=1) with rank 1's output filtered away: its pdb prompt waits unseen

source: https://github.com/pytorch/torchtitan/issues/652, https://github.com/pytorch/torchtitan/pull/4510
shape: torchtitan's run_train.sh shape: torchrun with --local-ranks-filter 0 --tee 3 (only rank
  0's output reaches the terminal), 2 ranks on gloo, and a torch.distributed.breakpoint(rank=1)
  left in the loss code; rank 1 sits at a pdb prompt no one sees, reading a stdin no one types
  into (the terminal: here a pipe the launch script holds open), while rank 0 waits in the
  barrier that breakpoint() puts on every other rank
launch: python
truth: hang
culprit: 1
frame: compute_loss
cause: other:rank_waiting_for_debugger_input
needs: torch
"""
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.block = torch.nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64,
                                                      batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def compute_loss(logits: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    if step == 5:
        if dist.get_rank() == 1:
            jobkit.hang_begins("rank 1 stops at a pdb prompt whose output is filtered away")
        torch.distributed.breakpoint(rank=1)    # why is rank 1's loss off?
    return loss


def train() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyTransformer())
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4)
    for step in range(1, 30):
        tokens = torch.randint(0, 256, (4, 17))
        loss = compute_loss(model(tokens[:, :-1]), tokens[:, 1:], step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


def run_train() -> int:
    """run_train.sh: torchrun, showing rank 0's output only; stdin is the (idle) terminal."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    terminal = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
         "--local-ranks-filter", "0", "--role", "rank", "--tee", "3", __file__, "train"],
        stdin=subprocess.PIPE)
    return terminal.wait()


if __name__ == "__main__":
    train() if sys.argv[1:] == ["train"] else sys.exit(run_train())
