"""Healthy: the rollout and reward servers get no requests while the trainer ranks train

source: https://github.com/verl-project/verl/pull/6673, https://github.com/modelscope/ms-swift/issues/6962
shape: server-mode GRPO: a rollout server and a reward server (FastAPI/uvicorn, idle in their
  event loops between bursts) and a 2-rank torchrun trainer that spends ~80 s on the optimizer
  phase (many DDP micro-steps) before its next request burst
launch: torchrun 2
truth: healthy
needs: torch, fastapi, uvicorn, requests
budget: 120
"""
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


def policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))


def rollout_server(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    jobkit.announce("server")
    app, model = FastAPI(), policy()

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/generate/")
    def generate(request: dict) -> dict:
        with torch.no_grad():
            return {"completion_ids": model(torch.tensor(request["prompt_ids"]))
                    .argmax(-1).tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def reward_server(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    jobkit.announce("reward")
    app = FastAPI()
    scorer = torch.nn.Linear(6, 1)

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/get_reward")
    def get_reward(request: dict) -> dict:
        with torch.no_grad():
            return {"rewards": scorer(torch.tensor(request["completions"]).float())
                    .squeeze(-1).tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def wait_until_up(url: str) -> None:
    import requests
    for _ in range(240):
        try:
            if requests.get(url).ok:
                return
        except requests.ConnectionError:
            time.sleep(0.5)


def main() -> None:
    import requests
    rank, world = jobkit.init()
    base = int(os.environ["MASTER_PORT"])
    rollout_url, reward_url = f"http://127.0.0.1:{base + 21}", f"http://127.0.0.1:{base + 23}"
    servers = []
    if rank == 0:
        servers = [subprocess.Popen([sys.executable, __file__, "--rollout", str(base + 21)]),
                   subprocess.Popen([sys.executable, __file__, "--reward", str(base + 23)])]
        wait_until_up(f"{rollout_url}/health/")
        wait_until_up(f"{reward_url}/health/")
    dist.barrier()
    model = DistributedDataParallel(policy())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    number = 0
    for step, micro_steps in enumerate([10, 280, 10]):
        prompts = torch.randint(0, 64, (8, 6))
        completions = torch.zeros(8, 6, dtype=torch.long)
        rewards = torch.zeros(8)
        if rank == 0:
            completions = torch.tensor(requests.post(f"{rollout_url}/generate/", json={
                "prompt_ids": prompts.tolist()}).json()["completion_ids"])
            rewards = torch.tensor(requests.post(f"{reward_url}/get_reward", json={
                "completions": completions.tolist()}).json()["rewards"])
        dist.broadcast(completions, src=0)
        dist.broadcast(rewards, src=0)
        if micro_steps > 10:
            jobkit.hang_begins("the optimizer phase: ~80 s of training, both servers idle")
        for _ in range(micro_steps):   # several PPO epochs over the rollout batch
            logp = model(prompts).log_softmax(-1).gather(-1, completions[..., None]).squeeze(-1)
            loss = -(logp.mean(-1) * (rewards - rewards.mean())).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            jobkit.step(number)
            number += 1
            time.sleep(0.25)
        print(f"rank {rank} step {step}: loss {loss.item():.4f}", flush=True)
    dist.barrier()
    for server in servers:
        server.terminate()
        server.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rollout"]:
        rollout_server(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--reward"]:
        reward_server(int(sys.argv[2]))
    else:
        main()
