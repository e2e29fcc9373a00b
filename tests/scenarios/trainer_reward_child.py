"""A GRPO-style trainer that starts its reward model's HTTP server itself, as a child of rank 0
(scripts that keep a verifier beside the trainer: ``subprocess.Popen([python, "reward.py",
...])`` before the first step), and scores each step's rollouts there. The server (this file
with ``--serve``: FastAPI, a plain ``def`` endpoint, so each request is handled in a thread of
uvicorn's pool) batches requests: it scores once 2 are in, and a request waits for its batch
with no timeout.

argv: MODE STEPS [URL] | --serve [PORT]
  partial-batch  rank 0 sends two requests a step (to URL where given: a server the job's launch
                 script started beside torchrun; else to the one it starts), each from a thread of its own; after STEPS
                 steps the epoch's last, smaller batch sends one, which the server holds for a
                 second that never comes. Rank 0 waits in its HTTP call, rank 1 in the step's
                 all_reduce. Started by torchrun.
  store-wait     one process, a world of one; after STEPS steps it waits in its weight-sync
                 store for the key the server sets once it loaded the new weights, which it
                 never does (its update failed). The server idles. Started as a plain script."""
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

BATCH = 2


def serve(port: int = 0) -> None:
    """The reward server: POST /score {"texts": [...]} -> {"scores": [...]}, once BATCH
    requests are in."""
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel

    ready = threading.Condition()
    pending: list[tuple[int, list[str]]] = []
    scored: dict[int, list[float]] = {}
    tickets = itertools.count()
    app = FastAPI()

    class Texts(BaseModel):
        texts: list[str]

    def wait_for_batch(ticket: int) -> list[float]:
        with ready:
            while ticket not in scored:
                ready.wait()      # the batch is not full yet: no timeout
            return scored.pop(ticket)

    @app.post("/score")
    def score_texts(body: Texts) -> dict:
        with ready:
            ticket = next(tickets)
            pending.append((ticket, body.texts))
            if len(pending) >= BATCH:
                for number, texts in pending:
                    scored[number] = [sum(c.isdigit() for c in t) / len(t) for t in texts]
                pending.clear()
                ready.notify_all()
        return {"scores": wait_for_batch(ticket)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server() -> tuple[subprocess.Popen, str]:
    """The reward server and its URL, once it listens."""
    server = subprocess.Popen([sys.executable, __file__, "--serve"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ports = [c.laddr.port for c in psutil.Process(server.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN]
        if ports:
            print(f"reward server pid {server.pid} at http://127.0.0.1:{ports[0]}", flush=True)
            return server, f"http://127.0.0.1:{ports[0]}"
        time.sleep(0.2)
    raise SystemExit("the reward server never listened")


def score(url: str, texts: list[str], out: list[float]) -> None:
    request = urllib.request.Request(f"{url}/score", json.dumps({"texts": texts}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:   # no timeout, as most scripts call it
        out.extend(json.load(reply)["scores"])


def score_rollouts(url: str, groups: list[list[str]]) -> list[float]:
    """Each group of completions scored in a request of its own, the requests at once."""
    scores: list[float] = []
    threads = [threading.Thread(target=score, args=(url, g, scores)) for g in groups[1:]]
    for thread in threads:
        thread.start()
    score(url, groups[0], scores)
    for thread in threads:
        thread.join()
    return scores


def train_step(model: torch.nn.Linear, reward: float) -> None:
    loss = (model(torch.randn(64, 64)).pow(2).mean() - reward).pow(2)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad = None


def wait_until_up(url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/docs", timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def partial_batch(steps: int, url: str = "") -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    server = None
    if rank == 0 and url:
        wait_until_up(url)
    elif rank == 0:
        server, url = start_server()
    model = torch.nn.Linear(64, 64)
    for step in range(steps + 1):
        groups = [[f"{step} + {i} = {step + i}"] for i in range(2 if step < steps else 1)]
        rewards = torch.tensor(sum(score_rollouts(url, groups)) if rank == 0 else 0.0)
        dist.all_reduce(rewards)
        train_step(model, float(rewards))
        print(f"rank {rank} step {step} reward {float(rewards):.3f}", flush=True)
    if server is not None:
        server.terminate()


def store_wait(steps: int) -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(hours=1))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    server, url = start_server()
    model = torch.nn.Linear(64, 64)
    for step in range(steps):
        train_step(model, sum(score_rollouts(url, [[f"{step} + 1"], [f"{step} + 2"]])))
        print(f"step {step}", flush=True)
    print("weights sent; waiting for the server to load them", flush=True)
    store.wait(["weights_loaded"])   # the server's update failed: it never sets the key
    server.terminate()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
        sys.exit(0)
    {"partial-batch": partial_batch, "store-wait": store_wait}[sys.argv[1]](int(sys.argv[2]),
                                                                          *sys.argv[3:])
