"""Healthy: a placement group stays pending until a second Ray node joins 80 s later, then schedules

source: https://github.com/vllm-project/vllm/pull/11138, https://github.com/vllm-project/aibrix/issues/228
shape: a 1-CPU Ray head (ray.cluster_utils, in-process) and a driver that asks for a placement group
  of two 1-CPU bundles and waits in ray.get(pg.ready()); the second node (`ray start --address ...
  --block`, 1 CPU) joins about 80 s later, the group is placed and two workers train a few steps
launch: python
truth: healthy
needs: ray, torch
budget: 130
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import jobkit


@ray.remote(num_cpus=1)
class TrainWorker:
    def __init__(self, rank: int) -> None:
        jobkit.announce(f"worker{rank}")
        torch.manual_seed(rank)
        self.model = torch.nn.Linear(16, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def train_step(self, step: int) -> float:
        loss = self.model(torch.randn(16, 16)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        jobkit.step(step)
        return loss.item()


def operator_starts_second_node(address: str, after: float, nodes: list) -> None:
    """The operator brings the late node up: `ray start --address=HEAD --num-cpus 1 --block`."""
    time.sleep(after)
    nodes.append(subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"),
                                   "start", f"--address={address}", "--num-cpus=1", "--block"],
                                  stdout=subprocess.DEVNULL))


def main() -> None:
    jobkit.announce("driver")
    # a Ray temp dir of this job's own: the nodes' address file stays out of /tmp/ray, where
    # any other job's plain ray.init() on this machine would read it and join this cluster
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-")
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address)
    nodes: list = []
    threading.Thread(target=operator_starts_second_node, args=(cluster.address, 80.0, nodes),
                     daemon=True).start()
    pg = placement_group([{"CPU": 1}] * 2, strategy="SPREAD")
    jobkit.hang_begins("the placement group waits for a second node that joins in ~80 s")
    started = time.time()
    ray.get(pg.ready())
    print(f"placement group ready after {time.time() - started:.0f}s", flush=True)
    workers = [TrainWorker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i)).remote(i) for i in range(2)]
    for step in range(10):
        print(step, ray.get([w.train_step.remote(step) for w in workers]), flush=True)
    remove_placement_group(pg)
    ray.shutdown()
    for node in nodes:
        node.terminate()
        node.wait()
    cluster.shutdown()


if __name__ == "__main__":
    main()
