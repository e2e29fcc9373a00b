"""Ray Train: only rank 0 reports its epoch checkpoint; rank 1 goes on to the next epoch's all-reduce

source: https://github.com/ray-project/ray/issues/38958, https://github.com/ray-project/ray/issues/33360, https://github.com/ray-project/ray/pull/50874
shape: TorchTrainer(train_func, ScalingConfig(num_workers=2, use_gpu=False)) with gloo DDP; to
  upload one copy of the checkpoint, the loop calls ray.train.report(metrics, checkpoint) under
  `if rank == 0:` with no report on the other ranks (Ray Train's docstring: all workers must call
  report the same number of times, "otherwise, your training will hang"); rank 0 waits in
  report's barrier for rank 1, rank 1's next backward waits in DDP's all-reduce for rank 0
launch: python
truth: hang
culprit: 1
frame: train_epoch
cause: collective_mismatch
needs: ray, ray.train, torch
"""
import os
import tempfile
import time

import ray
import torch
from ray import train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

import jobkit

EPOCH_STEPS = 6


def train_epoch(model, optimizer, epoch: int) -> float:
    loss = torch.tensor(0.0)
    for i in range(EPOCH_STEPS):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(epoch * EPOCH_STEPS + i)
        time.sleep(0.2)
    return loss.item()


def save_checkpoint(model, epoch: int, loss: float) -> None:
    """One copy of the weights: only rank 0 writes and reports it (the other ranks hold the same
    weights under DDP, so the loop skips their report)."""
    if train.get_context().get_world_rank() != 0:
        jobkit.hang_begins("rank 1 skips ray.train.report, which rank 0 waits in")
        return
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
        train.report({"epoch": epoch, "loss": loss},
                     checkpoint=train.Checkpoint.from_directory(folder))


def train_func(config: dict) -> None:
    rank = train.get_context().get_world_rank()
    jobkit.announce(rank)
    torch.manual_seed(rank)
    model = train.torch.prepare_model(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    for epoch in range(config["epochs"]):
        loss = train_epoch(model, optimizer, epoch)
        if epoch % 2 == 1:
            save_checkpoint(model, epoch, loss)


def main() -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": jobkit.ray_env()})
    timeout = float(os.environ.get("STALLBENCH_PG_TIMEOUT", 1800))
    trainer = TorchTrainer(
        train_func, train_loop_config={"lr": 1e-3, "epochs": 6},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 0.5}),
        torch_config=TorchConfig(backend="gloo", timeout_s=int(timeout)),
        run_config=RunConfig(name="stallbench_h45", storage_path=tempfile.mkdtemp()))
    print(trainer.fit(), flush=True)


if __name__ == "__main__":
    main()
