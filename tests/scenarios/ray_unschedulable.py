"""A verl-like driver whose rollout worker group asks Ray for GPUs its node does not have (the
node's Ray started without them: ``ray start`` without ``--num-gpus``, or CUDA_VISIBLE_DEVICES
empty where Ray started): ``python main_ppo.py`` calls ``ray.init()`` and waits for the group's
placement group, BUNDLES bundles of ``{"CPU": 1, "GPU": 1}`` packed in one node (STRICT_PACK, as
a tensor-parallel rollout's are). Ray never fails such a request; its autoscaler prints why once
in a while. The driver gives up after WAIT_SECONDS (default 15) as a job with its own deadline
does, exits 1."""
import os
import sys
import time

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import placement_group

BUNDLES = int(os.environ.get("BUNDLES", "2"))
WAIT_SECONDS = float(os.environ.get("WAIT_SECONDS", "15"))


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    print(f"creating the rollout worker group: {BUNDLES} x 1 GPU, STRICT_PACK", flush=True)
    group = placement_group([{"CPU": 1, "GPU": 1}] * BUNDLES, strategy="STRICT_PACK")
    started = time.monotonic()
    try:
        ray.get(group.ready(), timeout=WAIT_SECONDS)
    except GetTimeoutError:
        print(f"the rollout worker group was not placed in {time.monotonic() - started:.0f} s",
              flush=True)
        ray.shutdown()
        sys.exit(1)
    print("rollout worker group placed", flush=True)


if __name__ == "__main__":
    main()
