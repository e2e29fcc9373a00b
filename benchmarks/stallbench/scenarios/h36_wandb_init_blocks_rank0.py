"""Rank 0 blocks in the experiment tracker's init call (network); the other ranks wait in new_group

source: https://github.com/EleutherAI/bergson/pull/249, https://github.com/starVLA/starVLA/pull/369
shape: a 3-rank torchrun job (gloo) where only rank 0 starts the W&B run before training; the
  tracker's endpoint accepts the connection and never answers, so rank 0 sits in the HTTP call
  (no timeout) while ranks 1-2 go on to dist.new_group for the data-parallel group and wait.
  wandb is not installed here: rank 0 makes wandb.init's run-upsert GraphQL POST itself with
  requests, to WANDB_BASE_URL, a local listener that never accepts (no network on this machine)
launch: torchrun 3
truth: hang
culprit: 0
frame: init_tracker
cause: io_wait
needs: torch, requests
"""
import os
import socket
import subprocess
import sys
import time

import requests
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

UNREACHABLE_ENDPOINT = ("import socket, time\n"
                        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(64)\n"
                        "print(s.getsockname()[1], flush=True)\n"
                        "time.sleep(10 ** 6)\n")


def tracker_endpoint() -> str:
    """The W&B endpoint as this machine sees it: a host that takes the connection and is silent."""
    listener = subprocess.Popen([sys.executable, "-c", UNREACHABLE_ENDPOINT], stdout=subprocess.PIPE,
                                text=True)
    return f"http://127.0.0.1:{listener.stdout.readline().strip()}"


def init_tracker(project: str, config: dict) -> dict:
    base = os.environ["WANDB_BASE_URL"]
    query = ("mutation UpsertBucket($project: String, $config: JSONString) "
             "{ upsertBucket(input: {modelName: $project, config: $config}) { bucket { id } } }")
    jobkit.hang_begins("rank 0 calls the tracker's endpoint, which never answers")
    reply = requests.post(f"{base}/graphql", json={"query": query, "variables": {
        "project": project, "config": config}}, auth=("api", os.environ["WANDB_API_KEY"]))
    return reply.json()


def main() -> None:
    rank, world = jobkit.init()
    config = {"lr": 1e-3, "batch_size": 16, "world_size": world}
    if rank == 0:
        os.environ.setdefault("WANDB_BASE_URL", tracker_endpoint())
        os.environ.setdefault("WANDB_API_KEY", "local-" + "0" * 34)
        init_tracker("attribution-scores", config)
    data_parallel = dist.new_group(list(range(world)))
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(24, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4)),
        process_group=data_parallel)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    for step in range(30):
        loss = model(torch.randn(16, 24)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
