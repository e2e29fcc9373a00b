"""The training step the scenario jobs share: a small linear model whose gradients are
all-reduced over the process group (plain data parallelism, as DDP does it)."""
import torch
import torch.distributed as dist
from torch import nn


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    inputs, targets = torch.randn(32, 64), torch.randn(32, 1)
    loss = nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    optimizer.step()
    if dist.get_rank() == 0:
        print(f"step {step} loss {loss.item():.3f}", flush=True)
