"""Async GRPO weight sync: the server rejects an overlapping update; the trainer broadcasts alone

source: https://github.com/huggingface/trl/pull/6913, https://github.com/huggingface/trl/issues/6796
shape: TRL async GRPO: a vLLM server (FastAPI) whose worker shares a gloo group with the trainer;
  each sync POSTs /update_weights/ without reading the reply and broadcasts every tensor; at the
  epoch's end a second sync (before eval) gets 409 "update already active" and broadcasts alone
launch: python
truth: hang
culprit: server
frame: llm_worker
cause: waiting_on_server
needs: torch, fastapi, uvicorn, requests
"""
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

import jobkit


def policy_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 64))


# ---- the vLLM server (trl vllm-serve) ----

def llm_worker(updates: queue.Queue, model: torch.nn.Module, state: dict) -> None:
    """The engine's worker: receives every tensor of an update, then reloads the engine."""
    while True:
        updates.get()
        for param in model.parameters():
            dist.broadcast(param.data, src=0)
        time.sleep(1.5)   # reset the prefix cache and re-warm the engine with the new weights
        state["active"] = False


def serve(port: int, master_port: int) -> None:
    import uvicorn
    from fastapi import FastAPI, HTTPException
    jobkit.announce("server")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    model, updates, state = policy_model(), queue.Queue(), {"active": False}

    def init_communicator() -> None:
        jobkit.init(rank=1, world=2)
        jobkit.announce("server")
        llm_worker(updates, model, state)

    threading.Thread(target=init_communicator, daemon=True).start()
    app = FastAPI()

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/generate/")
    def generate(request: dict) -> dict:
        with torch.no_grad():
            ids = torch.tensor(request["prompt_ids"])
            return {"completion_ids": model(ids).argmax(-1).tolist()}

    @app.post("/update_weights/")
    def update_weights() -> dict:
        if state["active"]:
            raise HTTPException(409, "a weight update is already active")
        state["active"] = True
        updates.put(True)
        return {"message": "update started"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the trainer (accelerate launch --num_processes 1 async_grpo.py) ----

class AsyncGRPOTrainer:
    def __init__(self, url: str) -> None:
        import requests
        self.session, self.url = requests.Session(), url
        self.model = policy_model()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def sync_weights(self) -> None:
        threading.Thread(target=self.session.post, args=(f"{self.url}/update_weights/",),
                         daemon=True).start()   # the response is never read
        for param in self.model.parameters():
            dist.broadcast(param.data, src=0)

    def train_step(self, step: int) -> float:
        prompts = torch.randint(0, 64, (8, 6))
        answer = self.session.post(f"{self.url}/generate/", json={"prompt_ids": prompts.tolist()})
        completions = torch.tensor(answer.json()["completion_ids"])
        rewards = (completions % 3 == 0).float().mean(-1)
        logp = self.model(prompts).log_softmax(-1).gather(-1, completions[..., None]).squeeze(-1)
        loss = -(logp.mean(-1) * (rewards - rewards.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        jobkit.step(step)
        return loss.item()

    def evaluate(self) -> None:
        self.sync_weights()   # make sure the engine serves the newest weights
        print("eval:", self.session.post(f"{self.url}/generate/", json={
            "prompt_ids": [[1, 2, 3]]}).json(), flush=True)

    def train(self, epochs: int, steps_per_epoch: int) -> None:
        step = 0
        for epoch in range(epochs):
            for _ in range(steps_per_epoch):
                print(f"step {step}: loss {self.train_step(step):.4f}", flush=True)
                time.sleep(2.0)   # the next rollout batch is generated meanwhile
                self.sync_weights()
                step += 1
            if epoch == 0:
                jobkit.hang_begins("the eval sync starts while the step's update is still "
                                   "active: the server answers 409, the trainer broadcasts alone")
            self.evaluate()


def main() -> None:
    import requests
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        port, master_port = a.getsockname()[1], b.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(master_port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if requests.get(f"{url}/health/").ok:
                break
        except requests.ConnectionError:
            time.sleep(0.5)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    jobkit.init(rank=0, world=2)
    AsyncGRPOTrainer(url).train(epochs=3, steps_per_epoch=5)
    server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
