"""A Ray-backed TP=2 engine waits for a placement group of 2 GPUs; the second node registered none

source: https://github.com/vllm-project/vllm/issues/13909, https://github.com/gpustack/gpustack/issues/5509, https://github.com/vllm-project/vllm/pull/11138
shape: `vllm serve --tensor-parallel-size 2 --distributed-executor-backend ray` on a two-node Ray
  cluster whose second node detected its GPU as a TPU (two nodes started in-process with
  ray.cluster_utils); the engine asks for [{"GPU": 1}] * 2 and logs "Waiting for creating a
  placement group"
launch: python
truth: hang
culprit: engine
frame: _wait_until_pg_ready
cause: unschedulable
needs: ray, torch
"""
import logging
import os
import tempfile
import time

import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group

import jobkit

logger = logging.getLogger("vllm.executor.ray_utils")
PG_WAIT_TIMEOUT = 1800


def start_cluster() -> Cluster:
    """What `ray start --head` on node A and `ray start --address` on node B did."""
    # a Ray temp dir of this job's own: the nodes' address file stays out of /tmp/ray, where
    # any other job's plain ray.init() on this machine would read it and join this cluster
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"TPU": 1})   # node B's accelerator, misdetected
    return cluster


def _wait_until_pg_ready(pg, specs: list[dict]) -> None:
    start, interval = time.time(), 10
    ready_ref = pg.ready()
    while time.time() - start < PG_WAIT_TIMEOUT:
        ready, _ = ray.wait([ready_ref], timeout=interval)
        if ready:
            return
        interval *= 2
        logger.info("Waiting for creating a placement group of specs for %d seconds. specs=%s. "
                    "Check `ray status` and `ray list nodes` to see if you have enough resources.",
                    int(time.time() - start), specs)
    raise ValueError(f"Cannot provide a placement group of {specs} within {PG_WAIT_TIMEOUT} s.")


def initialize_ray_cluster(address: str, world_size: int) -> None:
    ray.init(address=address)
    logger.info("cluster resources: %s", ray.cluster_resources())
    specs = [{"GPU": 1.0} for _ in range(world_size)]
    pg = placement_group(specs, strategy="PACK")
    jobkit.hang_begins("the engine waits for 2 GPU bundles; the cluster has 1 GPU and 1 TPU")
    _wait_until_pg_ready(pg, specs)


def load_tokenizer_and_config() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(128, 32), torch.nn.Linear(32, 128))


def run_server() -> None:
    logging.basicConfig(level=logging.INFO, format="INFO %(asctime)s %(name)s: %(message)s")
    jobkit.announce("engine")
    model = load_tokenizer_and_config()
    cluster = start_cluster()
    initialize_ray_cluster(cluster.address, world_size=2)
    with torch.no_grad():
        print(model(torch.zeros(1, 4).long()).shape, flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    run_server()
