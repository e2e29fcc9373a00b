"""Reward-model training: a broadcast sized by the local batch; the rank with more image tokens waits alone

source: https://github.com/EchoseChen/SPA-VL-RLHF/issues/2
shape: a multimodal reward-model trainer on 3 ranks whose compute_loss broadcasts rank 0's
  image-token features with a length taken from the local batch (number of image tokens); at
  step 5 rank 2's batch has more image tokens. gloo does not check sizes (a smaller or larger single
  broadcast passes or aborts), so the features go in fixed 4096-element pieces: rank 2 waits in
  an extra broadcast while ranks 0 and 1 wait in backward's gradient all-reduce
launch: torchrun 3
truth: hang
culprit: 2
frame: compute_loss
cause: collective_mismatch
needs: torch
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

PIECE = 4096
FEATURE = 64


class RewardModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text = torch.nn.Linear(FEATURE, FEATURE)
        self.score = torch.nn.Linear(FEATURE, 1)

    def forward(self, text: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.text(text)) + image_tokens.mean(0, keepdim=True)
        return self.score(pooled).squeeze(-1)


def image_token_count(rank: int, step: int) -> int:
    return 160 if (rank == 2 and step == 5) else 128   # a taller image on rank 2 at step 5


def sync_image_features(local_count: int) -> torch.Tensor:
    """Rank 0's projected image features, to every rank, in pieces (length from the local batch)."""
    flat = torch.randn(local_count * FEATURE) if dist.get_rank() == 0 else torch.empty(local_count * FEATURE)
    for piece in flat.split(PIECE):
        dist.broadcast(piece, src=0)
    return flat.view(local_count, FEATURE)


def compute_loss(model, chosen: torch.Tensor, rejected: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    count = image_token_count(rank, step)
    if count != 128:
        jobkit.hang_begins(f"rank {rank} broadcasts {count} image tokens, the others 128: it waits "
                           "in one broadcast more")
    image_tokens = sync_image_features(count)
    margin = model(chosen, image_tokens) - model(rejected, image_tokens)
    return -torch.nn.functional.logsigmoid(margin).mean()


def main() -> None:
    rank, world = jobkit.init()
    torch.manual_seed(0)
    model = DistributedDataParallel(RewardModel())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(30):
        chosen, rejected = torch.randn(8, FEATURE), torch.randn(8, FEATURE)
        loss = compute_loss(model, chosen, rejected, rank, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        jobkit.step(step)
        if rank == 0:
            print(f"step {step} loss {float(logged) / world:.4f}", flush=True)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
