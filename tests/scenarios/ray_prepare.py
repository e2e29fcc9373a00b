"""A Ray driver whose first remote work joins no process group, as jobs do before their trainers
start: ``python prepare.py`` calls ``ray.init()`` (a local cluster) and waits in ``ray.get`` while
SHARDS Ray tasks each pull a checkpoint shard over HTTP from remote storage (``STORAGE_URL``,
``/shard-<i>``; a hub or an object store), writing it to a local file as it arrives, or, with
IN_MEMORY=1, keeping it in memory (an object store SDK's ``get_object().read()``, a dataset
streamed into a buffer). Nothing in the job is a rank. Prints ``fetched N shards (B bytes)`` and exits 0; a download that stalls
holds its task, and the driver, in their waits."""
import io
import os
import tempfile
import urllib.request

import ray

SHARDS = int(os.environ.get("SHARDS", "2"))
STORAGE_URL = os.environ["STORAGE_URL"]


IN_MEMORY = os.environ.get("IN_MEMORY") == "1"


@ray.remote(num_cpus=1)
def fetch_checkpoint_shard(index: int) -> int:
    received = 0
    with urllib.request.urlopen(f"{STORAGE_URL}/shard-{index}") as response, \
            tempfile.NamedTemporaryFile(suffix=".safetensors") as local:
        buffer = io.BytesIO()
        while chunk := response.read1(1 << 16):
            # the shard's local copy, as hub downloads keep it, or a buffer in memory
            (buffer if IN_MEMORY else local).write(chunk)
            received += len(chunk)
    return received


def main() -> None:
    ray.init(num_cpus=SHARDS)
    sizes = ray.get([fetch_checkpoint_shard.remote(i) for i in range(SHARDS)])
    print(f"fetched {len(sizes)} shards ({sum(sizes)} bytes)", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
