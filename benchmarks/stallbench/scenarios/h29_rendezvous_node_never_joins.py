"""A two-node launch where the second node never starts; node 0's ranks wait in the rendezvous

source: https://github.com/deepspeedai/Megatron-DeepSpeed/issues/338
shape: a pdsh/deepspeed-style multi-node runner (a hostfile of two nodes, 2 slots each, world
  size 4): it starts each node's ranks with RANK/WORLD_SIZE/MASTER_ADDR set and no torchrun
  agent; node 0 (this machine) starts ranks 0-1, the ssh to node1 fails (the host does not
  resolve here), the runner only logs it, and ranks 0-1 wait in init_process_group for ranks
  2-3, which never come. The frame given is where the present ranks wait: the culprits have none
launch: python
truth: hang
culprit: 2, 3
frame: setup_distributed
cause: rendezvous_missing_node
needs: torch
"""
import os
import socket
import subprocess
import sys
import time

HOSTFILE = [("localhost", 2), ("node1", 2)]


def setup_distributed(rank: int, world: int):
    import jobkit
    if rank == 0:
        jobkit.hang_begins("ranks 0-1 enter the rendezvous; node1's ranks 2-3 never start")
    return jobkit.init()


def train() -> None:
    import jobkit
    jobkit.announce(int(os.environ["RANK"]))

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = setup_distributed(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    model = DistributedDataParallel(torch.nn.Linear(32, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(50):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        time.sleep(0.2)
    dist.destroy_process_group()


def run_multinode() -> int:
    """What `deepspeed --hostfile hosts train.py` does: per node, start its slots' ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = sum(slots for _, slots in HOSTFILE)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    procs, first = [], 0
    for host, slots in HOSTFILE:
        for local in range(slots):
            rank_env = {**env, "RANK": str(first + local), "LOCAL_RANK": str(local),
                        "LOCAL_WORLD_SIZE": str(slots)}
            if host == "localhost":
                procs.append(subprocess.Popen([sys.executable, __file__, "train"],
                                              env={**os.environ, **rank_env}))
            else:
                exports = " ".join(f"{k}={v}" for k, v in rank_env.items())
                remote = subprocess.run(
                    ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host,
                     f"cd {os.getcwd()} && {exports} {sys.executable} {__file__} train"],
                    capture_output=True, text=True)
                print(f"{host}: {remote.stderr.strip() or remote.returncode}", flush=True)
        first += slots
    return max(proc.wait() for proc in procs)


if __name__ == "__main__":
    train() if sys.argv[1:] == ["train"] else sys.exit(run_multinode())
