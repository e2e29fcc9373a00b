"""Trainer and inference server disagree on the weight broadcast's source rank; both wait

source: https://github.com/sgl-project/sglang/issues/19251, https://github.com/sgl-project/sglang/pull/19255
shape: an SGLang-style server (FastAPI, TP=1; SGLang itself does not run here) and a 2-rank torchrun
  trainer; trainer rank 0 joins the server's weight-update group (a custom gloo group) as rank 1 and
  broadcasts from itself, while the server's update_weights_from_distributed broadcasts with src=0
launch: torchrun 2
truth: hang
culprit: 0, server
frame: update_weights_from_distributed
cause: collective_mismatch
needs: torch, fastapi, uvicorn, requests
"""
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


def tiny_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 32),
                               torch.nn.GELU(), torch.nn.Linear(32, 64))


def init_custom_process_group(master_address: str, master_port: int, rank: int,
                              world_size: int):
    """A second gloo group over its own store, as SGLang's and OpenRLHF's helpers build it."""
    store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0,
                          timeout=timedelta(hours=2))
    return dist.ProcessGroupGloo(store, rank, world_size, timedelta(hours=2))


def broadcast(tensor: torch.Tensor, src: int, group) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = src
    group.broadcast([tensor], options).wait()


# ---- the inference server (python -m sglang.launch_server --tp 1) ----

class ModelRunner:
    def __init__(self) -> None:
        self.model, self.group = tiny_lm(), None

    def init_weights_update_group(self, request: dict) -> None:
        self.group = init_custom_process_group(request["master_address"],
                                               request["master_port"],
                                               request["rank_offset"], request["world_size"])

    def update_weights_from_distributed(self, request: dict) -> None:
        params = dict(self.model.named_parameters())
        for name in request["names"]:
            weight = torch.empty_like(params[name])
            broadcast(weight, src=0, group=self.group)   # the source rank is fixed at 0
            params[name].data.copy_(weight)


def launch_server(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    jobkit.announce("server")
    app, runner = FastAPI(), ModelRunner()

    @app.get("/health")
    def health() -> dict:
        return {}

    @app.post("/generate")
    def generate(request: dict) -> dict:
        with torch.no_grad():
            return {"output_ids": runner.model(torch.tensor(request["input_ids"]))
                    .argmax(-1).tolist()}

    @app.post("/init_weights_update_group")
    def init_weights_update_group(request: dict) -> dict:
        runner.init_weights_update_group(request)
        return {"success": True}

    @app.post("/update_weights_from_distributed")
    def update_weights_from_distributed(request: dict) -> dict:
        runner.update_weights_from_distributed(request)
        return {"success": True}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the trainer (torchrun --nproc-per-node 2 train.py) ----

def post_in_background(url: str, body: dict) -> threading.Thread:
    import requests
    thread = threading.Thread(target=requests.post, args=(url,), kwargs={"json": body},
                              daemon=True)
    thread.start()
    return thread


def push_weights(model: torch.nn.Module, url: str, group) -> None:
    names = [name for name, _ in model.named_parameters()]
    post_in_background(f"{url}/update_weights_from_distributed", {"names": names})
    for _, param in model.named_parameters():
        broadcast(param.data, src=1, group=group)   # trainer rank 0 is rank 1 of this group


def main() -> None:
    import requests
    rank, world = jobkit.init()
    port, group_port = int(os.environ["MASTER_PORT"]) + 11, int(os.environ["MASTER_PORT"]) + 13
    url, group = f"http://127.0.0.1:{port}", None
    if rank == 0:
        server = subprocess.Popen([sys.executable, __file__, "--server", str(port)])
        for _ in range(240):
            try:
                if requests.get(f"{url}/health").ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)
        post_in_background(f"{url}/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": group_port, "rank_offset": 0,
            "world_size": 2})
        group = init_custom_process_group("127.0.0.1", group_port, 1, 2)
    dist.barrier()
    model = tiny_lm()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    for step in range(24):
        prompts = torch.randint(0, 64, (4, 6))
        if rank == 0:
            responses = torch.tensor(requests.post(f"{url}/generate", json={
                "input_ids": prompts.tolist()}).json()["output_ids"])
        else:
            responses = torch.randint(0, 64, (4, 6))
        logp = ddp(prompts).log_softmax(-1).gather(-1, responses[..., None]).mean()
        optimizer.zero_grad()
        (-logp).backward()
        optimizer.step()
        jobkit.step(step)
        time.sleep(0.3)
        if step % 4 == 3:
            if rank == 0:
                jobkit.hang_begins("rank 0 broadcasts the weights with src=1; the server "
                                   "broadcasts with src=0: both send, neither receives")
                push_weights(model, url, group)
            dist.barrier()
    if rank == 0:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--server"]:
        launch_server(int(sys.argv[2]))
    else:
        main()
