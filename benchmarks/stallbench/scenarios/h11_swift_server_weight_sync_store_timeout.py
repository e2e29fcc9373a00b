"""GRPO server mode: trainer rank 0 waits in the weight-sync group's barrier for the rollout server

source: https://github.com/modelscope/ms-swift/issues/4906, https://github.com/huggingface/open-r1/issues/690
shape: `swift rollout` (a FastAPI server with a weight-sync worker) plus a 2-rank torchrun GRPO
  trainer; rank 0 pushes each parameter with update_named_param (HTTP call, then broadcast and
  barrier in a store-based group); once the vision tower is unfrozen, the server cannot map its
  parameter names, answers the POST but never joins the barrier (vLLM's group is a small copy here)
launch: torchrun 2
truth: hang
culprit: server
frame: llm_worker
cause: waiting_on_server
needs: torch, fastapi, uvicorn, requests
"""
import io
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit


class StatelessProcessGroup:
    """vLLM's metadata group (the version in the thread): a TCPStore and per-source counters."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        self.rank, self.world_size = rank, world_size
        self.store = dist.TCPStore(host, port, world_size, is_master=rank == 0,
                                   timeout=timedelta(seconds=timeout))
        self.send, self.recv = 0, [0] * world_size

    def broadcast_obj(self, obj, src: int):
        if self.rank == src:
            self.store.set(f"/broadcast_from/{src}/{self.send}", pickle.dumps(obj))
            self.send += 1
            return obj
        key = f"/broadcast_from/{src}/{self.recv[src]}"
        self.recv[src] += 1
        return pickle.loads(self.store.get(key))

    def barrier(self) -> None:
        for src in range(self.world_size):
            self.broadcast_obj(None, src=src)


class Qwen2VLTiny(torch.nn.Module):
    """A vision tower and a language model, named like a multimodal checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.visual = torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.GELU())
        self.model = torch.nn.ModuleDict({"embed": torch.nn.Linear(16, 16),
                                          "layer": torch.nn.Linear(16, 16)})
        self.lm_head = torch.nn.Linear(16, 8)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        hidden = self.model["layer"](torch.relu(self.model["embed"](self.visual(pixels))))
        return self.lm_head(hidden)


# ---- the rollout server (`swift rollout`) ----

def llm_worker(commands: queue.Queue, model: torch.nn.Module, group_box: list) -> None:
    """The engine worker: joins the trainer's weight broadcasts, one parameter per command."""
    while True:
        name = commands.get()
        group = group_box[0]
        weight = group.broadcast_obj(None, src=group.world_size - 1)
        model.get_parameter(name).data.copy_(torch.load(io.BytesIO(weight)))
        group.barrier()


def serve_rollout(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    jobkit.announce("server")
    app, commands, group_box = FastAPI(), queue.Queue(), []
    # the serving engine names the language model's weights with a "language_model." prefix
    engine_model = torch.nn.ModuleDict({
        "visual": torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.GELU()),
        "language_model": torch.nn.ModuleDict({
            "model": torch.nn.ModuleDict({"embed": torch.nn.Linear(16, 16),
                                          "layer": torch.nn.Linear(16, 16)}),
            "lm_head": torch.nn.Linear(16, 8)})})
    names = {name for name, _ in engine_model.named_parameters()}
    threading.Thread(target=llm_worker, args=(commands, engine_model, group_box),
                     daemon=True).start()

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/init_communicator/")
    def init_communicator(request: dict) -> dict:
        def create() -> None:
            group_box.append(StatelessProcessGroup(request["host"], request["port"], 0,
                                                   request["world_size"], 7200))
        threading.Thread(target=create, daemon=True).start()
        return {"message": "ok"}

    @app.post("/generate/")
    def generate(request: dict) -> dict:
        with torch.no_grad():
            lm = engine_model["language_model"]
            hidden = engine_model["visual"](torch.randn(len(request["prompts"]), 24))
            out = lm["lm_head"](lm["model"]["layer"](torch.relu(lm["model"]["embed"](hidden))))
        return {"completion_ids": out.argmax(-1).tolist()}

    @app.post("/update_named_param/")
    def update_named_param(request: dict) -> dict:
        name = "language_model." + request["name"]
        if name not in names:    # the vision tower's names do not map: logged, then dropped
            print(f"[WARNING] update_named_param: unknown parameter {name}", flush=True)
            return {"message": "Request received, updating named parameter"}
        commands.put(name)
        return {"message": "Request received, updating named parameter"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the trainer (`swift rlhf --rlhf_type grpo --vllm_mode server`) ----

class VLLMClient:
    def __init__(self, base_url: str) -> None:
        import requests
        self.session, self.base_url = requests.Session(), base_url
        for _ in range(240):
            try:
                if self.session.get(f"{base_url}/health/").ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)

    def init_communicator(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.session.post(f"{self.base_url}/init_communicator/",
                          json={"host": "127.0.0.1", "port": port, "world_size": 2})
        time.sleep(0.5)
        self.group = StatelessProcessGroup("127.0.0.1", port, 1, 2, 7200)

    def generate(self, prompts: list[str]) -> list[list[int]]:
        return self.session.post(f"{self.base_url}/generate/",
                                 json={"prompts": prompts}).json()["completion_ids"]

    def update_named_param(self, name: str, weights: torch.Tensor) -> None:
        self.session.post(f"{self.base_url}/update_named_param/",
                          json={"name": name, "dtype": str(weights.dtype),
                                "shape": list(weights.shape)})
        buffer = io.BytesIO()
        torch.save(weights, buffer)
        self.group.broadcast_obj(buffer.getvalue(), src=self.group.rank)
        self.group.barrier()


def _move_model_to_vllm(model: torch.nn.Module, client: VLLMClient, step: int) -> None:
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("visual."):
            jobkit.hang_begins("rank 0 pushes the first vision-tower weight; the server drops it "
                               "and never joins the barrier")
        client.update_named_param(name, param.data)


def main() -> None:
    rank, world = jobkit.init()
    server = client = None
    if rank == 0:
        port = int(os.environ["MASTER_PORT"]) + 17
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
        client = VLLMClient(f"http://127.0.0.1:{port}")
        client.init_communicator()
    dist.barrier()
    torch.manual_seed(0)
    model = Qwen2VLTiny()
    model.visual.requires_grad_(False)   # freeze_vit for the first steps
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters()], lr=1e-4)
    for step in range(30):
        if step == 6:
            model.visual.requires_grad_(True)
        if rank == 0:
            completions = client.generate([f"describe image {step}-{i}" for i in range(4)])
        loss = ddp(torch.randn(4, 24)).log_softmax(-1)[:, 0].mean().neg()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        if step % 3 == 2:
            if rank == 0:
                _move_model_to_vllm(model, client, step)
            dist.barrier()
        time.sleep(0.2)
    if server is not None:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_rollout(int(sys.argv[2]))
    else:
        main()
