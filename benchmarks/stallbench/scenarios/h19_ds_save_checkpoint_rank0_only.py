"""DeepSpeed save_checkpoint called on rank 0 only; rank 1 goes on training and the two never meet

source: https://github.com/deepspeedai/DeepSpeed/pull/801, https://github.com/deepspeedai/DeepSpeed/issues/2993
shape: a DeepSpeed ZeRO-1 job (here on the CPU accelerator with gloo) that checkpoints every 4
  steps with `if dist.get_rank() == 0: engine.save_checkpoint(dir)`; rank 0 waits inside
  save_checkpoint's collectives while rank 1, which skipped the save, waits in its next step's sync
launch: torchrun 2
truth: hang
culprit: 1
frame: train_step
cause: collective_mismatch
needs: torch, deepspeed
"""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import time

import deepspeed
import torch
import torch.distributed as dist

import jobkit

CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1000,
}


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train_step(engine, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    x, y = batch
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    return float(loss)


def main() -> None:
    rank, world = jobkit.init()
    deepspeed.init_distributed(dist_backend="gloo")
    model = Regressor()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=CONFIG)
    checkpoint_dir = os.path.join(os.getcwd(), "checkpoints")
    skipped_save = False
    for number in range(40):
        if skipped_save:
            jobkit.hang_begins("rank 1 skipped save_checkpoint and runs the next step; rank 0 "
                               "waits inside save_checkpoint")
        loss = train_step(engine, (torch.randn(8, 24), torch.randn(8, 1)))
        jobkit.step(number)
        if (number + 1) % 4 == 0:
            if dist.get_rank() == 0:
                engine.save_checkpoint(checkpoint_dir, tag=f"step{number + 1}")
            else:
                skipped_save = True
            print(f"rank {rank} step {number + 1} loss {loss:.4f}", flush=True)
        time.sleep(0.2)
    dist.barrier()


if __name__ == "__main__":
    main()
