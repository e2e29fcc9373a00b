"""GRPO server mode: the first infer request to a DP=2 rollout server never returns

source: https://github.com/modelscope/ms-swift/issues/5176
shape: `swift rollout --vllm_data_parallel_size 2` (a FastAPI server, two DP engine processes that
  step in lockstep) and a 2-rank `swift rlhf --vllm_mode server` trainer; the first request is
  split unevenly, DP engine 0 finishes its share and stops stepping, engine 1 waits for it in the
  DP step sync, so the server's infer never answers: rank 0 waits in the HTTP call, rank 1 in
  all_gather_object (tiny torch decoders stand in for the two vLLM engines)
launch: torchrun 2
truth: hang
culprit: server
frame: infer
cause: waiting_on_server
needs: torch, fastapi, uvicorn, requests
"""
import multiprocessing
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class TinyDecoder(torch.nn.Module):
    def __init__(self, vocab: int = 256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 48)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(),
                                       torch.nn.Linear(96, vocab))

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens[:, -1])).argmax(-1, keepdim=True)


# ---- `swift rollout --vllm_data_parallel_size 2` ----

def dp_engine(dp_rank: int, connection, step_sync) -> None:
    """One DP engine: decodes its share of a request; every decode step is synchronised with
    the other DP engine (vLLM's DP ranks run their forward passes together)."""
    jobkit.announce(f"engine{dp_rank}")
    torch.manual_seed(0)
    model = TinyDecoder()
    while True:
        request = connection.recv()
        tokens = torch.tensor(request["prompt_ids"])
        for step in range(request["max_tokens"]):
            step_sync.wait()                       # the DP step: both engines, or neither
            tokens = torch.cat([tokens, model.decode_step(tokens)], dim=1)
            time.sleep(0.01)
        if dp_rank == 0:
            jobkit.hang_begins("DP engine 0 finished its share and stops stepping; engine 1 "
                               "waits for it in the DP step sync, the server's infer waits")
        connection.send(tokens[:, -request["max_tokens"]:].tolist())


def swift_rollout(port: int, data_parallel_size: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    jobkit.announce("server")
    spawn = multiprocessing.get_context("spawn")
    step_sync = spawn.Barrier(data_parallel_size)
    connections = []
    for dp_rank in range(data_parallel_size):
        parent, child = spawn.Pipe()
        spawn.Process(target=dp_engine, args=(dp_rank, child, step_sync), daemon=True).start()
        connections.append(parent)
    app = FastAPI()

    class InferRequest(BaseModel):
        prompt_ids: list[list[int]]
        max_tokens: int = 16

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/infer/")
    def infer(request: InferRequest) -> dict:
        # the requests are spread over the DP engines by length: the longest go to engine 1
        ranked = sorted(request.prompt_ids, key=len)
        half = len(ranked) // 2
        shares = [(ranked[:half], request.max_tokens // 4), (ranked[half:], request.max_tokens)]
        for connection, (prompts, max_tokens) in zip(connections, shares):
            width = max(len(p) for p in prompts)
            connection.send({"prompt_ids": [[0] * (width - len(p)) + p for p in prompts],
                             "max_tokens": max_tokens})
        completions = []
        for connection in connections:             # waits for every DP engine's share
            completions.extend(connection.recv())
        return {"completion_ids": completions}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the trainer (`swift rlhf --rlhf_type grpo --vllm_mode server`) ----

class VLLMClient:
    def __init__(self, port: int) -> None:
        import requests
        self.session, self.base_url = requests.Session(), f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if self.session.get(f"{self.base_url}/health/").ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.5)

    def infer(self, prompt_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
        return self.session.post(f"{self.base_url}/infer/", json={
            "prompt_ids": prompt_ids, "max_tokens": max_tokens}).json()["completion_ids"]


def _generate_completions(client, rank: int, world: int, step: int) -> list[list[int]]:
    prompts = [[(7 * step + i) % 250 + 1] * (3 + i) for i in range(8)]
    completions = client.infer(prompts, max_tokens=64) if rank == 0 else None
    gathered = [None] * world
    dist.all_gather_object(gathered, completions)
    return gathered[0][rank::world]


def main() -> None:
    rank, world = jobkit.init()
    server = client = None
    if rank == 0:
        port = int(os.environ["MASTER_PORT"]) + 31
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
        client = VLLMClient(port)
    dist.barrier()
    torch.manual_seed(0)
    policy = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(256, 32),
                                                         torch.nn.Linear(32, 256)))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    for step in range(20):
        completions = torch.tensor(_generate_completions(client, rank, world, step))
        rewards = (completions % 3 == 0).float().mean(1)
        logprobs = torch.log_softmax(policy(completions[:, :-1]), -1).gather(
            -1, completions[:, 1:, None]).squeeze(-1)
        loss = -(logprobs.mean(1) * (rewards - rewards.mean())).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
    if server is not None:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        swift_rollout(int(sys.argv[2]), data_parallel_size=2)
    else:
        main()
