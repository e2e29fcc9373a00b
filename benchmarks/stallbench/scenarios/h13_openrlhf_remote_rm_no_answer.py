"""The trainer blocks on a remote reward-model HTTP call that never returns

source: https://github.com/OpenRLHF/OpenRLHF/issues/1123
shape: a reward server (FastAPI/uvicorn, serve_rm) batching queries for its model, and a Ray PPO
  job whose actor rank 0 scores each rollout batch with remote_rm_fn (requests.post, no timeout)
  and broadcasts to rank 1; the epoch's last batch has 16 queries, the batcher waits for 64
launch: python
truth: hang
culprit: server
frame: get_reward
cause: waiting_on_server
needs: ray, torch, fastapi, uvicorn, requests
"""
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import ray
import torch
import torch.distributed as dist

import jobkit

FORWARD = ("STALLBENCH_TRUTH", "STALLBENCH_PIDS", "PYTHONPATH")


# ---- the reward server (python -m openrlhf.cli.serve_rm ... --port 5000) ----

class RewardModelProxy:
    """Collects queries into batches of `batch_size` and scores each full batch at once."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                         torch.nn.Linear(32, 1))
        self.pending: list[tuple[str, Future]] = []
        self.full = threading.Condition()
        threading.Thread(target=self.batch_loop, daemon=True).start()

    def submit(self, query: str) -> Future:
        future: Future = Future()
        with self.full:
            self.pending.append((query, future))
            self.full.notify()
        return future

    def batch_loop(self) -> None:
        while True:
            with self.full:
                self.full.wait_for(lambda: len(self.pending) >= self.batch_size)
                batch, self.pending = self.pending[:self.batch_size], self.pending[self.batch_size:]
            features = torch.stack([torch.tensor([float(ord(c) % 7) for c in (q + " " * 16)[:16]])
                                    for q, _ in batch])
            with torch.no_grad():
                scores = self.model(features).squeeze(-1).tolist()
            for (_, future), score in zip(batch, scores):
                future.set_result(score)


def serve_rm(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    jobkit.announce("server")
    app, proxy = FastAPI(), RewardModelProxy(batch_size=64)

    @app.post("/get_reward")
    def get_reward(data: dict) -> dict:
        futures = [proxy.submit(query) for query in data["query"]]
        return {"rewards": [future.result() for future in futures]}

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the PPO job (train_ppo_ray --remote_rm_url http://localhost:PORT/get_reward) ----

def remote_rm_fn(url: str, queries: list[str]) -> list[float]:
    import requests
    return requests.post(url=url, json={"query": queries}).json()["rewards"]


@ray.remote(num_cpus=0.5)
class ActorModelRayActor:
    def __init__(self, rank: int, world: int, master_port: int, rm_url: str) -> None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
        self.rank, self.world, self.rm_url = rank, world, rm_url
        jobkit.announce(rank)

    def fit(self, prompts: list[str], rollout_batch_size: int) -> None:
        jobkit.init(rank=self.rank, world=self.world)
        torch.manual_seed(0)
        policy = torch.nn.Linear(16, 16)
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-5)
        for step, start in enumerate(range(0, len(prompts), rollout_batch_size)):
            batch = prompts[start:start + rollout_batch_size]   # the epoch's last one is short
            states = torch.randn(len(batch), 16)
            with torch.no_grad():
                responses = policy(states).argmax(-1).tolist()
            rewards = torch.zeros(len(batch))
            if self.rank == 0:
                queries = [f"{prompt} {response}" for prompt, response in zip(batch, responses)]
                if len(queries) < rollout_batch_size:
                    jobkit.hang_begins("rank 0 posts the epoch's last 16 queries; the reward "
                                       "server waits for a batch of 64 before it answers")
                rewards = torch.tensor(remote_rm_fn(self.rm_url, queries))
            dist.broadcast(rewards, src=0)
            loss = -(policy(states).log_softmax(-1)[:, 0] * (rewards - rewards.mean())).mean()
            optimizer.zero_grad()
            loss.backward()
            for param in policy.parameters():
                dist.all_reduce(param.grad)
            optimizer.step()
            jobkit.step(step)
            time.sleep(0.5)


def main() -> None:
    jobkit.announce("driver")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        rm_port = sock.getsockname()[1]
    rm = subprocess.Popen([sys.executable, __file__, "--serve-rm", str(rm_port)])
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {
        k: os.environ[k] for k in FORWARD if k in os.environ}})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        master_port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{rm_port}/get_reward"
    import requests
    for _ in range(120):
        try:
            requests.get(url.replace("get_reward", "health"))
            break
        except requests.ConnectionError:
            time.sleep(0.5)
    actors = [ActorModelRayActor.remote(rank, 2, master_port, url) for rank in range(2)]
    prompts = [f"Question {i}: what is {i} + {i * 3}?" for i in range(208)]
    ray.get([actor.fit.remote(prompts, 64) for actor in actors])
    ray.shutdown()
    rm.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-rm"]:
        serve_rm(int(sys.argv[2]))
    else:
        main()
