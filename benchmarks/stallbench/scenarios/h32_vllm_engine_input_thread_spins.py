"""The engine's input thread spins forever evicting a ghost key from the multimodal cache

source: https://github.com/vllm-project/vllm/issues/43941, https://github.com/vllm-project/vllm/issues/47958, https://github.com/vllm-project/vllm/pull/43595
shape: `vllm serve` shape, emulated: API server (FastAPI) + EngineCore process (input, output and
  busy-loop threads over zmq) with vLLM's own LRUCache and the pre-fix touch(); an eval client sends
  an over-long image request, the same image again, then new images; eviction loops on the ghost
launch: python
truth: hang
culprit: engine
frame: preprocess_add_request
cause: livelock_spin
needs: torch, fastapi, uvicorn, requests, zmq, vllm
python: vllm
"""
import hashlib
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import jobkit

MAX_MODEL_LEN = 64
ITEM_BYTES = 3 * 16 * 16 * 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- EngineCore (its own process, as vLLM starts it) ----

def make_receiver_cache(capacity_bytes: int):
    from vllm.utils.cache import LRUCache

    class MultiModalReceiverCache(LRUCache):
        def touch(self, key) -> None:   # before vllm#43595: a missing key goes into the order
            try:
                self._LRUCache__order.move_to_end(key)
            except KeyError:
                self._LRUCache__order[key] = None

    return MultiModalReceiverCache(capacity_bytes, getsizeof=lambda item: item.nbytes)


class EngineCore:
    def __init__(self, input_address: str, output_address: str) -> None:
        import torch
        torch.manual_seed(0)
        self.vision = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.decoder = torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Linear(32, 256))
        self.mm_cache = make_receiver_cache(capacity_bytes=3 * ITEM_BYTES)
        self.input_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        threading.Thread(target=self.process_input_sockets, args=(input_address,),
                         daemon=True, name="process_input_sockets").start()
        threading.Thread(target=self.process_output_sockets, args=(output_address,),
                         daemon=True, name="process_output_sockets").start()

    def process_input_sockets(self, address: str) -> None:
        import zmq
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.connect(address)
        while True:
            request = sock.recv_pyobj()
            self.input_queue.put(self.preprocess_add_request(request))

    def preprocess_add_request(self, request: dict) -> dict:
        for mm_hash, item in zip(request["mm_hashes"], request["mm_items"]):
            if item is None:              # the frontend's sender cache says we hold it
                self.mm_cache.touch(mm_hash)
                continue
            oldest = next(iter(self.mm_cache.order), None)
            if oldest is not None and oldest not in self.mm_cache and \
                    self.mm_cache.currsize + item.nbytes > self.mm_cache.maxsize:
                jobkit.hang_begins("the input thread must evict to store a new image; the "
                                   "oldest key is a ghost, so eviction never frees anything")
            self.mm_cache[mm_hash] = item
        request["features"] = [self.mm_cache.get(h) for h in request["mm_hashes"]]
        return request

    def process_output_sockets(self, address: str) -> None:
        import zmq
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.connect(address)
        while True:
            sock.send_pyobj(self.output_queue.get())

    def _process_input_queue(self) -> dict:
        return self.input_queue.get()

    def run_busy_loop(self) -> None:
        import torch
        while True:
            request = self._process_input_queue()
            if len(request["prompt_token_ids"]) > MAX_MODEL_LEN:
                self.output_queue.put({"id": request["id"], "error": "prompt too long"})
                continue
            with torch.no_grad():
                ids = torch.tensor(request["prompt_token_ids"][-8:])
                for feature in request["features"]:
                    if feature is not None:
                        ids = ids + int(self.vision(feature[None]).sum()) % 7
                out = []
                for _ in range(request["max_tokens"]):
                    nxt = int(self.decoder(ids)[-1].argmax())
                    out.append(nxt)
                    ids = torch.cat([ids[1:], torch.tensor([nxt])])
            self.output_queue.put({"id": request["id"], "token_ids": out})


def run_engine_core(input_address: str, output_address: str) -> None:
    jobkit.announce("engine")
    EngineCore(input_address, output_address).run_busy_loop()


# ---- the API server (vllm serve) ----

def serve(port: int) -> None:
    import asyncio

    import torch
    import uvicorn
    import zmq
    from fastapi import FastAPI
    jobkit.announce("server")
    input_address = f"tcp://127.0.0.1:{free_port()}"
    output_address = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context.instance()
    to_engine = ctx.socket(zmq.PUSH)
    to_engine.bind(input_address)
    from_engine = ctx.socket(zmq.PULL)
    from_engine.bind(output_address)
    engine = multiprocessing.get_context("spawn").Process(
        target=run_engine_core, args=(input_address, output_address), daemon=True)
    engine.start()
    app, sent_hashes, waiting, lock = FastAPI(), set(), {}, threading.Lock()
    loop_box: list = []

    def output_handler() -> None:
        while True:
            out = from_engine.recv_pyobj()
            future = waiting.pop(out["id"])
            loop_box[0].call_soon_threadsafe(future.set_result, out)

    threading.Thread(target=output_handler, daemon=True).start()

    @app.get("/health")
    def health() -> dict:
        if not engine.is_alive():
            raise RuntimeError("engine dead")
        return {}

    @app.post("/v1/completions")
    async def completions(body: dict) -> dict:
        if not loop_box:
            loop_box.append(asyncio.get_running_loop())
        generator = torch.Generator().manual_seed(body["image_seed"])
        image = torch.rand(3, 16, 16, generator=generator)
        mm_hash = hashlib.sha256(image.numpy().tobytes()).hexdigest()
        with lock:
            item = None if mm_hash in sent_hashes else image
            sent_hashes.add(mm_hash)      # the sender cache marks it as sent ...
        if len(body["prompt_token_ids"]) > MAX_MODEL_LEN:   # ... before the length check
            return {"error": f"prompt longer than max_model_len={MAX_MODEL_LEN}"}
        request_id = f"cmpl-{len(sent_hashes)}-{time.time_ns()}"
        future = asyncio.get_running_loop().create_future()
        waiting[request_id] = future
        to_engine.send_pyobj({"id": request_id, "prompt_token_ids": body["prompt_token_ids"],
                              "max_tokens": body["max_tokens"], "mm_hashes": [mm_hash],
                              "mm_items": [item]})
        return await future

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---- the eval client ----

def run_eval() -> None:
    import requests
    jobkit.announce("client")
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if requests.get(f"{url}/health").ok:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    samples = [(seed, 20) for seed in range(100, 106)]       # (image, prompt length)
    samples += [(7, 200), (7, 20)]                             # an over-long one, then a retry
    samples += [(seed, 20) for seed in range(110, 140)]
    for number, (image_seed, prompt_len) in enumerate(samples):
        body = {"prompt_token_ids": list(range(prompt_len)), "max_tokens": 8,
                "image_seed": image_seed}
        answer = requests.post(f"{url}/v1/completions", json=body).json()
        print(f"sample {number}: {answer.get('error') or answer.get('token_ids')}", flush=True)
        time.sleep(0.3)
    server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    else:
        run_eval()
