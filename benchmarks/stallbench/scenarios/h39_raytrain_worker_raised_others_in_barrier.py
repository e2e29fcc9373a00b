"""A Ray Train worker's metrics callback raises; that worker never reaches the barrier

source: https://github.com/ray-project/ray/pull/28314, https://github.com/ray-project/ray/pull/29927
shape: TorchTrainer(train_func, ScalingConfig(num_workers=2, use_gpu=False)) with gloo DDP; Ray 2.60
  fails fast when train_func raises (PR 28314), so here the raise is in each worker's metrics-logger
  thread: worker 1's dies on an overflowed metric and its flush before checkpointing waits forever
launch: python
truth: hang
culprit: 1
frame: flush_metrics
cause: other:rank_raised_exception
needs: ray, ray.train, torch
"""
import math
import os
import queue
import tempfile
import threading
import time

import ray
import torch
import torch.distributed as dist
from ray import train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH", "STALLBENCH_PG_TIMEOUT")


class MetricsCallback:
    """Logs each step's metrics from a background thread, so logging never slows a step."""

    def __init__(self, rank: int) -> None:
        self.rank, self.metrics = rank, queue.Queue()
        self.history: list[dict] = []
        threading.Thread(target=self._log_forever, daemon=True, name="metrics-logger").start()

    def on_step_end(self, step: int, metrics: dict) -> None:
        self.metrics.put({"step": step, **metrics})

    def _log_forever(self) -> None:
        while True:
            record = self.metrics.get()
            if not math.isfinite(record["perplexity"]):
                raise ValueError(f"rank {self.rank}: perplexity overflow at step {record['step']}")
            self.history.append(record)
            self.metrics.task_done()

    def flush_metrics(self) -> None:
        self.metrics.join()


def train_func(config: dict) -> None:
    context = train.get_context()
    rank = context.get_world_rank()
    jobkit.announce(rank)
    torch.manual_seed(rank)
    model = train.torch.prepare_model(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    callback = MetricsCallback(rank)
    for step in range(config["steps"]):
        x = torch.randn(32, 16)
        if rank == 1 and step == 7:
            x = x * 1e3   # an unnormalised batch in worker 1's shard
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        callback.on_step_end(step, {"loss": loss.item(), "perplexity": loss.exp().item(),
                                    "grad_norm": grad_norm.item()})
        jobkit.step(step)
        time.sleep(0.3)
        if step % 8 == 7:   # checkpoint: flush the metrics, then all ranks meet
            if rank == 1:
                jobkit.hang_begins("worker 1's metrics thread died on the overflow; its flush "
                                   "waits for it forever, worker 0 waits in the barrier")
            callback.flush_metrics()
            dist.barrier()
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                train.report({"loss": loss.item(), "step": step},
                             checkpoint=train.Checkpoint.from_directory(folder))


def main() -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    timeout = float(os.environ.get("STALLBENCH_PG_TIMEOUT", 1800))
    trainer = TorchTrainer(
        train_func, train_loop_config={"lr": 0.01, "steps": 32},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 0.5}),
        torch_config=TorchConfig(backend="gloo", timeout_s=int(timeout)),
        run_config=RunConfig(name="stallbench_h39", storage_path=tempfile.mkdtemp()))
    print(trainer.fit(), flush=True)


if __name__ == "__main__":
    main()
