"""Rank 0's tokenizer download from the Hub stalls; rank 1 waits in the barrier after it

source: https://github.com/kubernetes-sigs/inference-perf/issues/609, https://github.com/mosaicml/composer/pull/2071
shape: a 2-rank torchrun fine-tuning job (gloo) where local rank 0 downloads the tokenizer with
  AutoTokenizer.from_pretrained while the other rank waits in dist.barrier() to load it from the
  cache afterwards; the download connection goes silent mid-file (a byte every few seconds, under
  the client's read timeout), so it never ends. No network here: HF_ENDPOINT is a local stand-in
  for the Hub that answers the metadata request and then trickles the file body
launch: torchrun 2
truth: hang
culprit: 0
frame: load_tokenizer
cause: io_wait
needs: torch, transformers, huggingface_hub
"""
import http.server
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODEL = "acme-research/tiny-instruct-tokenizer"
COMMIT = "3f8e1c2b9a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f"


class StalledHub(http.server.BaseHTTPRequestHandler):
    """The Hub as rank 0 sees it: metadata answers, then a file body that trickles."""
    protocol_version = "HTTP/1.1"
    size = 2_400_000

    def _headers(self) -> None:
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{abs(hash(self.path)):x}"')
        self.send_header("Content-Length", str(self.size))
        self.send_header("Content-Type", "application/json")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._headers()

    def do_GET(self) -> None:
        if self.path.startswith("/api/"):
            body = json.dumps({"id": MODEL, "sha": COMMIT, "siblings": [
                {"rfilename": name} for name in ("tokenizer_config.json", "tokenizer.json")]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())
            return
        self._headers()
        self.wfile.write(b'{"added_tokens_decoder": {')
        self.wfile.flush()
        while True:
            time.sleep(4)
            self.wfile.write(b" ")
            self.wfile.flush()

    def log_message(self, *args) -> None:
        pass


def serve_hub_stand_in() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StalledHub)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def start_hub_stand_in() -> str:
    hub = subprocess.Popen([sys.executable, __file__, "hub"], stdout=subprocess.PIPE, text=True)
    return f"http://127.0.0.1:{hub.stdout.readline().strip()}"


def load_tokenizer(cache: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(MODEL, cache_dir=cache)


def main() -> None:
    import jobkit
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank == 0:
        os.environ["HF_ENDPOINT"] = start_hub_stand_in()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = jobkit.init()
    cache = Path("hf-cache").resolve()
    if local_rank == 0:
        jobkit.hang_begins("local rank 0 downloads the tokenizer; the connection goes silent")
        tokenizer = load_tokenizer(cache)
    dist.barrier()
    if local_rank != 0:
        tokenizer = load_tokenizer(cache)
    model = DistributedDataParallel(torch.nn.Embedding(len(tokenizer), 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(20):
        ids = torch.tensor(tokenizer(["fine-tuning on the instruct set"])["input_ids"])
        loss = model(ids).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    serve_hub_stand_in() if sys.argv[1:] == ["hub"] else main()
