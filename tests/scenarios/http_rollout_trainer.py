"""A GRPO-style trainer whose rollouts come from a vLLM server over HTTP (as TRL's and swift's
server mode, and verl's / OpenRLHF's remote rollouts, do): each rank asks the server for a group
of completions of its prompt (OpenAI's completions API, no timeout, as most scripts call it),
scores them with a rule reward, and the ranks average their rewards (gloo all_reduce) before the
next step. Started by torchrun.

argv: URL MODEL STEPS"""
import json
import os
import sys
import time
import urllib.request

import torch
import torch.distributed as dist


def rollout(url: str, model: str, prompt: str) -> list[str]:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 16, "n": 4,
                       "temperature": 1.0}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        return [choice["text"] for choice in json.load(reply)["choices"]]


def main() -> None:
    url, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(steps):
        started = time.monotonic()
        texts = rollout(url, model, f"What is {11 + rank} + {27 + step}?")
        reward = torch.tensor([sum(any(c.isdigit() for c in t) for t in texts) / len(texts)])
        dist.all_reduce(reward)
        if rank == 0:
            print(f"train step {step}: mean reward {reward.item() / dist.get_world_size():.2f}, "
                  f"{time.monotonic() - started:.2f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
