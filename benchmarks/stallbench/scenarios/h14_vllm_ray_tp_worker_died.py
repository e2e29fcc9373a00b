"""A tensor-parallel engine on Ray loses one worker; the driver's all-reduce waits, nothing errors

source: https://github.com/vllm-project/vllm/issues/2050, https://github.com/vllm-project/vllm/issues/16259
shape: LLM(tensor_parallel_size=2, distributed_executor_backend="ray"): the driver process holds TP
  rank 0, a Ray actor holds rank 1 (gloo stands in for NCCL); the actor is killed with SIGKILL on a
  request, a helper it forked keeps its sockets open, so rank 0's all-reduce waits as NCCL's does
launch: python
truth: hang
culprit: worker1
frame: execute_model
cause: engine_dead
needs: ray, torch
"""
import multiprocessing
import os
import signal
import socket
import time

import ray
import torch
import torch.distributed as dist

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")


class RowParallelMLP(torch.nn.Module):
    """One TP shard of a tiny MLP: the partial outputs are summed with an all-reduce."""

    def __init__(self, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        torch.manual_seed(tp_rank)
        self.up = torch.nn.Linear(32, 64 // tp_size)
        self.down = torch.nn.Linear(64 // tp_size, 32, bias=tp_rank == 0)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        partial = self.down(torch.relu(self.up(hidden)))
        dist.all_reduce(partial)
        return partial


def prefetch_weights(parent: int, driver: int) -> None:
    """The worker's forked weight prefetcher: it idles while the engine runs."""
    while os.path.exists(f"/proc/{driver}"):
        time.sleep(1.0)


class Worker:
    def __init__(self, tp_rank: int, tp_size: int) -> None:
        self.tp_rank, self.tp_size = tp_rank, tp_size

    def init_device(self, master_port: int, driver_pid: int) -> None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
        jobkit.init(rank=self.tp_rank, world=self.tp_size)
        self.model = RowParallelMLP(self.tp_rank, self.tp_size)
        if self.tp_rank > 0:
            jobkit.announce(f"worker{self.tp_rank}")
            multiprocessing.get_context("fork").Process(
                target=prefetch_weights, args=(os.getpid(), driver_pid), daemon=False).start()

    def execute_model(self, step: int, hidden: torch.Tensor) -> torch.Tensor:
        if self.tp_rank == 1 and step == 6:
            jobkit.hang_begins("TP worker 1 is killed (SIGKILL, the OOM killer) on this request; "
                               "rank 0 waits in the all-reduce")
            os.kill(os.getpid(), signal.SIGKILL)
        with torch.no_grad():
            return self.model(hidden)


@ray.remote(num_cpus=0.5)
class RayWorkerWrapper(Worker):
    pass


class LLMEngine:
    def __init__(self, tensor_parallel_size: int) -> None:
        ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
            k: os.environ[k] for k in FORWARD if k in os.environ}})
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.workers = [RayWorkerWrapper.remote(rank, tensor_parallel_size)
                        for rank in range(1, tensor_parallel_size)]
        refs = [w.init_device.remote(port, os.getpid()) for w in self.workers]
        self.driver_worker = Worker(0, tensor_parallel_size)
        self.driver_worker.init_device(port, os.getpid())
        jobkit.announce("driver")
        ray.get(refs)

    def step(self, number: int, hidden: torch.Tensor) -> torch.Tensor:
        refs = [w.execute_model.remote(number, hidden) for w in self.workers]
        output = self.driver_worker.execute_model(number, hidden)
        ray.get(refs)
        return output


def main() -> None:
    engine = LLMEngine(tensor_parallel_size=2)
    hidden = torch.randn(4, 32)
    for number in range(40):   # the serving loop: one engine step per batch of requests
        hidden = torch.tanh(engine.step(number, hidden))
        jobkit.step(number)
        print(f"step {number}: {float(hidden.norm()):.3f}", flush=True)
        time.sleep(0.5)
    ray.shutdown()


if __name__ == "__main__":
    main()
