"""A resource pool's placement group can never be scheduled; the task runner waits for it forever

source: https://github.com/ray-project/ray/issues/27287, https://github.com/verl-project/verl/issues/503, https://github.com/verl-project/verl/pull/6663
shape: verl-style launcher: the driver starts a TaskRunner actor (it holds 1 CPU), which builds
  the actor/rollout resource pool as a placement group of two 1-CPU bundles and waits on
  ray.get(pg.ready()); a 2-CPU Ray cluster has only 1 CPU left, so the group stays pending
launch: python
truth: hang
culprit: runner
frame: create_resource_pool
cause: unschedulable
needs: ray, torch
"""
import os
import time

import ray
import torch
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")


@ray.remote(num_cpus=1)
class ActorRolloutRefWorker:
    def __init__(self, rank: int) -> None:
        jobkit.announce(f"worker{rank}")
        self.model = torch.nn.Linear(16, 16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5)

    def update_actor(self, step: int) -> float:
        loss = self.model(torch.randn(8, 16)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        jobkit.step(step)
        return float(loss)


def create_resource_pool(process_on_nodes: list[int]) -> list:
    bundles = [{"CPU": 1} for count in process_on_nodes for _ in range(count)]
    pg = placement_group(bundles, strategy="PACK", name="global_pool")
    jobkit.hang_begins("the task runner waits for a placement group of 2 CPUs; it holds "
                       "1 of the cluster's 2 itself")
    ray.get(pg.ready())
    return [pg]


@ray.remote(num_cpus=1)
class TaskRunner:
    def run(self, config: dict) -> None:
        jobkit.announce("runner")
        pools = create_resource_pool(config["process_on_nodes"])
        workers = [ActorRolloutRefWorker.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pools[0], bundle_index)).remote(
            bundle_index) for bundle_index in range(sum(config["process_on_nodes"]))]
        for step in range(config["total_training_steps"]):
            print(step, ray.get([w.update_actor.remote(step) for w in workers]), flush=True)
            time.sleep(0.5)


def run_ppo(config: dict) -> None:
    jobkit.announce("driver")
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    runner = TaskRunner.remote()
    ray.get(runner.run.remote(config))
    ray.shutdown()


if __name__ == "__main__":
    run_ppo({"process_on_nodes": [2], "total_training_steps": 20})
