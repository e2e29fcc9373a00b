"""A Ray driver whose first remote work joins no process group and takes a while, as jobs do
before their trainers start: ``python prepare.py`` calls ``ray.init()`` (a local cluster) and waits
in ``ray.get`` while SHARDS Ray tasks each pull a checkpoint shard from remote storage (here a
wait of FETCH_SECONDS, default 12: network, no CPU). Nothing in the job is a rank. Prints
``fetched N shards`` and exits 0."""
import os
import time

import ray

SHARDS = int(os.environ.get("SHARDS", "2"))
FETCH_SECONDS = float(os.environ.get("FETCH_SECONDS", "12"))


@ray.remote(num_cpus=1)
def fetch_checkpoint_shard(index: int) -> int:
    time.sleep(FETCH_SECONDS)   # the object store's transfer, as slow as it is
    return index


def main() -> None:
    ray.init(num_cpus=SHARDS)
    shards = ray.get([fetch_checkpoint_shard.remote(i) for i in range(SHARDS)])
    print(f"fetched {len(shards)} shards", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
