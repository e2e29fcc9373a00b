"""Healthy: torchrun's c10d rendezvous waits for a second node that starts 90 s late

source: https://github.com/meta-pytorch/torchx/issues/1071, https://github.com/pytorch/pytorch/issues/107021
shape: a two-node elastic job (one torchrun agent per node, both on this machine, one rank each,
  gloo) with --rdzv-backend c10d and --rdzv-conf join_timeout=600; the scheduler places node 1
  90 s after node 0, so node 0's agent waits in the rendezvous with no workers, then both
  start and train. The launch script stands in for the scheduler. Slow, not stuck
launch: python
truth: healthy
needs: torch
budget: 160
"""
import os
import socket
import subprocess
import sys
import time

NODE_1_DELAY = 90


def train() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import jobkit
    rank, world = jobkit.init()
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(20):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        time.sleep(0.2)
    print(f"rank {rank}/{world}: done, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


def start_node(endpoint: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "pretrain-42",
         "--rdzv-conf", "join_timeout=600", __file__, "train"])


def schedule() -> int:
    import jobkit
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    nodes = [start_node(endpoint)]
    jobkit.hang_begins("node 0's agent waits in the c10d rendezvous; node 1 starts 90 s later")
    time.sleep(NODE_1_DELAY)
    nodes.append(start_node(endpoint))
    return max(node.wait() for node in nodes)


if __name__ == "__main__":
    train() if sys.argv[1:] == ["train"] else sys.exit(schedule())
