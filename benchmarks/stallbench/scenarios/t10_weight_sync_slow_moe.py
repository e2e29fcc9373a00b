"""Healthy: pushing an MoE-like model's thousands of tensors to the rollout server takes a minute

source: https://github.com/huggingface/trl/issues/3557, https://github.com/OpenRLHF/OpenRLHF/issues/533, https://github.com/OpenRLHF/OpenRLHF/pull/593
shape: GRPO server mode: a rollout server (FastAPI) with a weight-sync worker, and a 2-rank torchrun
  trainer whose rank 0 pushes each of ~25,000 small expert tensors with update_named_param (HTTP,
  then broadcast and barrier in a store-based group), rank 1 waiting in a barrier; slow, not stuck
launch: torchrun 2
truth: healthy
needs: torch, fastapi, uvicorn, requests
budget: 130
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
    """vLLM's metadata group: a TCPStore and per-source counters."""

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


class Expert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(8, 8, bias=False)
        self.up_proj = torch.nn.Linear(8, 8, bias=False)
        self.down_proj = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(torch.nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(8, experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert() for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.gate(x).argmax(-1)
        return x + torch.stack([self.experts[int(e)](row) for row, e in zip(x, choice)])


class TinyMoE(torch.nn.Module):
    """Qwen3-MoE's layout in miniature: 64 layers of 128 experts, each with gate, up and down
    projections: almost no parameters, about 25,000 tensors."""

    def __init__(self, layers: int = 64, experts: int = 128) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(SparseMoeBlock(experts) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def llm_worker(commands: queue.Queue, model: torch.nn.Module, group_box: list) -> None:
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
    app, commands, group_box, model = FastAPI(), queue.Queue(), [], TinyMoE()
    threading.Thread(target=llm_worker, args=(commands, model, group_box), daemon=True).start()

    @app.get("/health/")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/init_communicator/")
    def init_communicator(request: dict) -> dict:
        def create() -> None:
            group_box.append(StatelessProcessGroup(request["host"], request["port"], 0,
                                                   request["world_size"], 300))
        threading.Thread(target=create, daemon=True).start()
        return {"message": "ok"}

    @app.post("/generate/")
    def generate(request: dict) -> dict:
        with torch.no_grad():
            return {"values": model(torch.tensor(request["x"])).sum(-1).tolist()}

    @app.post("/update_named_param/")
    def update_named_param(request: dict) -> dict:
        commands.put(request["name"])
        return {"message": "Request received, updating named parameter"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


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
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.session.post(f"{base_url}/init_communicator/",
                          json={"host": "127.0.0.1", "port": port, "world_size": 2})
        time.sleep(0.5)
        self.group = StatelessProcessGroup("127.0.0.1", port, 1, 2, 300)

    def update_named_param(self, name: str, weights: torch.Tensor) -> None:
        self.session.post(f"{self.base_url}/update_named_param/",
                          json={"name": name, "dtype": str(weights.dtype),
                                "shape": list(weights.shape)})
        buffer = io.BytesIO()
        torch.save(weights, buffer)
        self.group.broadcast_obj(buffer.getvalue(), src=self.group.rank)
        self.group.barrier()


def _move_model_to_vllm(model: torch.nn.Module, client: VLLMClient) -> None:
    started = time.time()
    for number, (name, param) in enumerate(model.named_parameters()):
        client.update_named_param(name, param.data)
        if number % 2000 == 0:
            print(f"synced {number} tensors in {time.time() - started:.0f}s", flush=True)


def main() -> None:
    rank, world = jobkit.init()
    server = client = None
    if rank == 0:
        port = int(os.environ["MASTER_PORT"]) + 19
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
        client = VLLMClient(f"http://127.0.0.1:{port}")
    dist.barrier()
    model = DistributedDataParallel(TinyMoE(), find_unused_parameters=True)   # unrouted experts
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
    jobkit.hang_begins("the weight sync: rank 0 pushes ~25,000 tensors one by one, rank 1 "
                       "waits in the barrier")
    if rank == 0:
        _move_model_to_vllm(model.module, client)
    dist.barrier()
    if server is not None:
        server.terminate()
        server.wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_rollout(int(sys.argv[2]))
    else:
        main()
