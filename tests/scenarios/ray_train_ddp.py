"""A Ray Train (TorchTrainer) DDP job on the CPU, in the shape of Ray's "Get started with
PyTorch" guide, started as ``python ray_train_ddp.py``: the driver starts a local Ray cluster
with ``ray.init()`` and the training loop runs in WORKERS Ray worker processes (actors started by
the raylet, not children of the driver's Python code), which Ray Train joins into one gloo
process group (``init_method="env"``: it sets MASTER_ADDR/MASTER_PORT/RANK/... itself).

WORKERS ranks (default 2) train a Linear model wrapped by ``ray.train.torch.prepare_model`` (DDP)
for STEPS steps (default 6); each prints ``rank R step S`` as it enters a step. With STUCK_RANK
set to a world rank (unset or -1: a healthy run), that rank blocks for good at step STUCK_STEP
(default 2) in a function named STUCK_FUNC (default ``load_shard``), before its forward pass; the
other ranks wait in DDP's gradient all-reduce in ``backward()``. Results go under RUN_STORAGE
(default: a fresh temporary directory, removed at the end).

A worker group restarted after a failure (``FailureConfig(max_failures=MAX_FAILURES)``, default
0): with FAIL_RANK set, that rank raises at step FAIL_STEP (default 1) in its first attempt only
("corrupt shard", as a bad file on shared storage does); Ray Train then ends the group and
starts a new one, from scratch. With STUCK_AFTER_FAILURE=1 the stuck rank blocks only in that
second attempt.

A checkpoint reported by some ranks only (ray-project/ray#38958's shape, without its ``else``):
with REPORT_EVERY set, after every REPORT_EVERY-th step the ranks listed in REPORT_RANKS
(comma separated) save the model and call ``ray.train.report`` with its checkpoint from
``report_checkpoint``; the other ranks skip the call and go on to the next step."""
import os
import shutil
import tempfile
import threading
import types

import torch

import ray
import ray.train
import ray.train.torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

WORKERS = int(os.environ.get("WORKERS", "2"))
STEPS = int(os.environ.get("STEPS", "6"))
STUCK_RANK = int(os.environ.get("STUCK_RANK", "-1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "2"))
STUCK_FUNC = os.environ.get("STUCK_FUNC", "load_shard")
FAIL_RANK = int(os.environ.get("FAIL_RANK", "-1"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "1"))
MAX_FAILURES = int(os.environ.get("MAX_FAILURES", "0"))
STUCK_AFTER_FAILURE = os.environ.get("STUCK_AFTER_FAILURE") == "1"
REPORT_EVERY = int(os.environ.get("REPORT_EVERY", "0"))
REPORT_RANKS = [int(r) for r in os.environ.get("REPORT_RANKS", "").split(",") if r]


def load_shard() -> None:
    """Where the stuck rank stops: waits on an event nobody sets."""
    threading.Event().wait()


def report_checkpoint(model, step: int, loss: float) -> None:
    """One checkpoint of the weights (DDP keeps them the same on every rank), reported."""
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
        ray.train.report({"loss": loss, "step": step},
                         checkpoint=ray.train.Checkpoint.from_directory(folder))


def _named(name: str):
    """``load_shard`` under the name ``name`` (its code object renamed, as py-spy and
    ``sys._current_frames`` show it; file and line numbers stay this file's)."""
    code = load_shard.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, globals(), name)


def train_loop_per_worker(config: dict) -> None:
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    failed_before = os.path.exists(config["failed_flag"])
    for step in range(config["steps"]):
        print(f"rank {rank} step {step}", flush=True)
        if rank == config["fail_rank"] and step == config["fail_step"] and not failed_before:
            open(config["failed_flag"], "w").close()
            raise RuntimeError(f"corrupt shard: rank {rank} read 0 of 4096 bytes at step {step}")
        if (rank == config["stuck_rank"] and step == config["stuck_step"]
                and (failed_before or not config["stuck_after_failure"])):
            _named(config["stuck_func"])()
        x, y = torch.randn(8, 32), torch.randint(0, 2, (8,))
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if config["report_every"] and step % config["report_every"] == config["report_every"] - 1 \
                and rank in config["report_ranks"]:
            report_checkpoint(model, step, loss.item())
    ray.train.report({"loss": loss.item(), "steps": config["steps"]})


def main() -> None:
    storage = os.environ.get("RUN_STORAGE")
    scratch = None if storage else tempfile.mkdtemp(prefix="ray_train_ddp_")
    ray.init(num_cpus=WORKERS, include_dashboard=False)
    try:
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"steps": STEPS, "stuck_rank": STUCK_RANK,
                               "stuck_step": STUCK_STEP, "stuck_func": STUCK_FUNC,
                               "fail_rank": FAIL_RANK, "fail_step": FAIL_STEP,
                               "stuck_after_failure": STUCK_AFTER_FAILURE,
                               "failed_flag": os.path.join(storage or scratch, "failed-once"),
                               "report_every": REPORT_EVERY, "report_ranks": REPORT_RANKS},
            scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
            run_config=RunConfig(name="ray_train_ddp", storage_path=storage or scratch,
                                 failure_config=FailureConfig(max_failures=MAX_FAILURES)),
        )
        result = trainer.fit()
        print(f"done: {result.metrics}", flush=True)
    finally:
        ray.shutdown()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
