"""A training loop under NVIDIA Resiliency Extension's fault tolerance, as its basic example and
Megatron's integration use it: every rank connects to its rank monitor (``RankMonitorClient``,
started by ``ft_launcher``) and sends a heartbeat after each step (data, forward / backward, a
gradient all-reduce over gloo). At STUCK_STEP (default 4) rank STUCK_RANK (default 1) blocks in
its batch fetch for good (a read from a storage mount that stopped answering); the other rank
waits in all-reduce. Neither sends another heartbeat, and each rank's monitor, after
``--ft-rank-heartbeat-timeout``, kills its rank."""
import os
import time

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

STUCK_RANK = int(os.environ.get("STUCK_RANK", "1"))
STUCK_STEP = int(os.environ.get("STUCK_STEP", "4"))


def fetch_batch(step: int, rank: int) -> torch.Tensor:
    if rank == STUCK_RANK and step == STUCK_STEP:
        while True:
            time.sleep(1)
    return torch.randn(16, 32)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()
    model = torch.nn.Linear(32, 32)
    for step in range(40):
        batch = fetch_batch(step, rank)
        model(batch).pow(2).mean().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        monitor.send_heartbeat()
        if rank == 0:
            print(f"step {step} done", flush=True)
        time.sleep(0.3)
    monitor.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
