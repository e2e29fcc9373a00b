"""Healthy: local rank 0 downloads a checkpoint from a slow hub while rank 1 waits in a barrier

source: https://github.com/mosaicml/composer/pull/2071, https://github.com/mosaicml/llm-foundry/pull/1795
shape: a 2-rank job (mp.spawn) that fine-tunes from a monolithic checkpoint: local rank 0
  streams it with requests from a model hub (here a local HTTP server, ~1 MB/s for 64 MB, in the
  launching process) while rank 1 waits in dist.barrier(); then both load it and train
launch: spawn 2
truth: healthy
needs: torch, requests
budget: 120
"""
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

CHECKPOINT_BYTES = 64 * 1024 * 1024
RATE = 1024 * 1024
CHUNK = 64 * 1024


class HubHandler(BaseHTTPRequestHandler):
    """Serves /resolve/main/model.bin at about 1 MB/s, as a busy hub does for a big file."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(CHECKPOINT_BYTES))
        self.end_headers()
        block, started = bytes(CHUNK), time.time()
        for number in range(CHECKPOINT_BYTES // CHUNK):
            self.wfile.write(block)
            time.sleep(max(0.0, started + (number + 1) * CHUNK / RATE - time.time()))

    def log_message(self, *args) -> None:
        pass


def download_checkpoint(url: str, path: str) -> None:
    done, last = 0, time.time()
    with requests.get(url, stream=True, timeout=60) as response, open(path + ".part", "wb") as out:
        response.raise_for_status()
        for block in response.iter_content(1024 * 1024):
            out.write(block)
            done += len(block)
            if time.time() - last > 10:
                print(f"downloading model.bin: {done / 2**20:.0f} MiB", flush=True)
                last = time.time()
    os.replace(path + ".part", path)


def train(rank: int, world: int) -> None:
    jobkit.init(rank=rank, world=world)
    path = os.path.join(os.getcwd(), "model.bin")
    jobkit.hang_begins("local rank 0 downloads the checkpoint; rank 1 waits in barrier()")
    if int(os.environ["LOCAL_RANK"]) == 0:
        download_checkpoint(os.environ["HUB_URL"] + "/resolve/main/model.bin", path)
    dist.barrier()
    print(f"rank {rank}: checkpoint ready, {os.path.getsize(path) / 2**20:.0f} MiB", flush=True)
    model = DistributedDataParallel(torch.nn.Linear(32, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(10):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
        time.sleep(0.1)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()


def main() -> None:
    jobkit.announce("hub")
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    threading.Thread(target=server.serve_forever, name="hub", daemon=True).start()
    os.environ["HUB_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
    jobkit.spawn(train, 2)
    server.shutdown()


if __name__ == "__main__":
    main()
