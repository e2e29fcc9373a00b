"""Healthy: a placement group stays pending until a second Ray node joins 80 s later, then schedules

source: https://github.com/vllm-project/vllm/pull/11138, https://github.com/vllm-project/aibrix/issues/228
shape: a 1-CPU Ray head (ray.cluster_utils, in-process) and a driver that asks for a placement group
  of two 1-CPU bundles and waits in ray.get(pg.ready()); the operator's second node (1 CPU) joins
  about 80 s later, the group is placed and the two workers train a few steps
launch: python
truth: healthy
needs: ray, torch
budget: 130
"""
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


def operator_starts_second_node(cluster: Cluster, after: float) -> None:
    """What `ray start --address=HEAD --num-cpus 1` on the late node does."""
    time.sleep(after)
    cluster.add_node(num_cpus=1)


def main() -> None:
    jobkit.announce("driver")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray.init(address=cluster.address)
    threading.Thread(target=operator_starts_second_node, args=(cluster, 80.0),
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
    cluster.shutdown()


if __name__ == "__main__":
    main()
