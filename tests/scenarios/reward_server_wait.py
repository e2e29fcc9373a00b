"""Ranks train with an all_reduce per step; at step 2, rank WAIT_RANK scores its batch with a
reward server at 127.0.0.1:REWARD_PORT (no timeout) that accepts the connection and never
answers, while the other ranks wait in the all_reduce. With IN_EXECUTOR=1 the request is
posted from a thread pool's thread while the main thread waits on its future, as swift 3.x's
rollout client (``VLLMClient.infer``) does."""
import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

WAIT_RANK = int(os.environ.get("WAIT_RANK", "0"))


def score_with_reward_model(texts: list[str]) -> list[float]:
    request = urllib.request.Request(f"http://127.0.0.1:{os.environ['REWARD_PORT']}/score",
                                     data=json.dumps({"texts": texts}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:   # no timeout: waits as long as the server
        return json.loads(reply.read())["scores"]


def main() -> None:
    dist.init_process_group("gloo")
    for step in range(5):
        if step == 2 and dist.get_rank() == WAIT_RANK:
            if os.environ.get("IN_EXECUTOR") == "1":
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(score_with_reward_model, ["a completion"]).result()
            else:
                score_with_reward_model(["a completion"])
        dist.all_reduce(torch.ones(8))
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
