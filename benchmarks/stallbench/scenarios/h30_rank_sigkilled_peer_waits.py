"""A whole node is SIGKILLed (agent and rank) mid-checkpoint; rank 0 waits for its shard forever

source: https://github.com/pytorch/pytorch/issues/17113, https://github.com/open-mmlab/mmdetection/issues/343
shape: a two-node DDP job (one torchrun agent per node, one rank each, gloo) that saves a sharded
  checkpoint: each rank writes its shard and ticks a key in a TCPStore, and rank 0 commits once
  every shard is there; the OOM killer takes node 1's whole process tree (agent and rank, SIGKILL)
  while it writes, so node 0's agent is never told and rank 0 waits in the store for the shard
launch: python
truth: hang
culprit: 1
frame: save_shard
cause: dead_rank
needs: torch
"""
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

CHECKPOINTS = Path("checkpoints")


def save_shard(model, optimizer, rank: int, step: int) -> Path:
    folder = CHECKPOINTS / f"step_{step:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
    if rank == 1 and step == 10:
        jobkit.hang_begins("node 1 is OOM-killed (agent and rank, SIGKILL) while writing its shard")
        os.kill(os.getppid(), signal.SIGKILL)     # the node's torchrun agent
        os.kill(os.getpid(), signal.SIGKILL)
    path = folder / f"shard_{rank}.pt"
    torch.save(state, path)
    return path


def commit_checkpoint(store: dist.TCPStore, world: int, step: int) -> None:
    store.wait([f"ckpt/{step}/shard{r}" for r in range(world)], timedelta(hours=4))
    (CHECKPOINTS / f"step_{step:05d}" / "COMMITTED").write_text(str(step))
    store.set(f"ckpt/{step}/committed", "1")


def save_checkpoint(store, model, optimizer, rank: int, world: int, step: int) -> None:
    save_shard(model, optimizer, rank, step)
    store.set(f"ckpt/{step}/shard{rank}", "1")
    if rank == 0:
        commit_checkpoint(store, world, step)
    else:
        store.wait([f"ckpt/{step}/committed"], timedelta(hours=4))


def train() -> None:
    rank, world = jobkit.init()
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["CKPT_STORE_PORT"]), world,
                          is_master=rank == 0, timeout=timedelta(hours=4))
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, 31):
        x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        if step % 5 == 0:
            save_checkpoint(store, model, optimizer, rank, world, step)
        time.sleep(0.3)
    dist.destroy_process_group()


def launch_nodes() -> None:
    """What the cluster's launcher does: one torchrun agent per node (both nodes are this machine)."""
    master_port, store_port = free_port(), free_port()
    nodes = []
    for node_rank in range(2):
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
             "--master-port", str(master_port), __file__, "train"],
            env={**os.environ, "CKPT_STORE_PORT": str(store_port)}))
        time.sleep(2)
    for node_rank, node in enumerate(nodes):
        print(f"node {node_rank} exited with {node.wait()}", flush=True)


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    train() if sys.argv[1:] == ["train"] else launch_nodes()
