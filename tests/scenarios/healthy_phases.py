"""A healthy data-parallel training job with one long, legitimate phase in the middle.

It trains 3 steps (a small linear model, gradients all-reduced over gloo), then runs the long
phase(s) named by PHASE, one after the other with STEPS_AFTER training steps after each, on the
ranks in PHASE_RANKS -- the slow parts of real jobs that
are not hangs: an evaluation that is one big matmul loop or a deep forward pass, a key derivation
inside a C extension, rank 0 writing a checkpoint to slow storage while the others sit in a
barrier, rank 0 reading an eval set from slow storage while the others wait for the metrics
broadcast, tokenizing in a multiprocessing pool, ``datasets.map(num_proc=2)``, a DataLoader with
worker processes, loading model shards from slow storage. The other ranks meanwhile wait inside
a torch.distributed call. Then 2 more steps, and the job exits 0. Each phase logs
``<kind>: started at <time>`` and ``<kind>: done in <s> s at <time>`` (wall-clock seconds).

Environment:
  PHASE          matmul_loop | long_forward | c_extension_call | checkpoint_one_rank |
                 evaluation_one_rank | pool_preprocess | datasets_map | dataloader_workers |
                 slow_storage_load, or a comma list of them         (default matmul_loop)
  PHASE_SECONDS  how long the compute phases last                   (default 10)
  PHASE_RANKS    comma list of ranks that run the phase, or "all"   (default "all"; "0" for
                 checkpoint_one_rank and evaluation_one_rank)
  PHASE_MB       checkpoint_one_rank: megabytes written             (default 40)
  SLOW_PATH      checkpoint_one_rank: FIFO written to; evaluation_one_rank: FIFO read from;
                 slow_storage_load: FIFOs SLOW_PATH.<rank> read from (created and served by the
                 test harness, see tests/load.py)
  SLOW_PATH_<KIND>  that kind's path instead of SLOW_PATH (a job with several phases)
  STEPS_AFTER    training steps after each phase                    (default 2)
"""
import hashlib
import multiprocessing
import os
import random
import time
import zlib

import torch
import torch.distributed as dist
from torch import nn

from data_parallel import train_step
from exit_race import leave

PHASES = [kind.strip() for kind in os.environ.get("PHASE", "matmul_loop").split(",")]
PHASE_SECONDS = float(os.environ.get("PHASE_SECONDS", "10"))
PHASE_MB = int(os.environ.get("PHASE_MB", "40"))
SLOW_PATH = os.environ.get("SLOW_PATH", "")
STEPS_AFTER = int(os.environ.get("STEPS_AFTER", "2"))   # training steps after each phase
ONE_RANK_KINDS = ("checkpoint_one_rank", "evaluation_one_rank")


def log(msg: str) -> None:
    print(f"[rank {dist.get_rank()}] {msg}", flush=True)


# ---------------------------------------------------------------- matmul_loop
def evaluate_retrieval(seconds: float) -> torch.Tensor:
    """Score a query batch against a corpus block again and again (~25 ms per matmul)."""
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    out, end = a, time.monotonic() + seconds
    while time.monotonic() < end: out = a @ b  # noqa: E701
    return out.mean().reshape(1)


# ---------------------------------------------------------------- long_forward
def build_deep_mlp(depth: int = 48, width: int = 512) -> nn.Sequential:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


def evaluate(seconds: float) -> torch.Tensor:
    """Forward passes of a deep MLP over the eval batch until the time is up (~50 ms each)."""
    torch.set_num_threads(1)
    model, batch = build_deep_mlp().eval(), torch.randn(128, 512)
    logits, end = batch, time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end: logits = model(batch)  # noqa: E701
    return logits.mean().reshape(1)


# ---------------------------------------------------------------- c_extension_call
def calibrate_pbkdf2(seconds: float) -> int:
    """Iterations of PBKDF2-SHA256 that last about ``seconds`` on this node, as loaded now."""
    sample = 1_000_000  # ~0.3 s: long enough to see this node's CPU contention
    start = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"calibrate", b"salt", sample)
    return max(1, int(sample * seconds / (time.perf_counter() - start)))


def derive_checkpoint_key(iterations: int) -> bytes:
    """Derive the key that encrypts the checkpoint: one long call into OpenSSL."""
    return hashlib.pbkdf2_hmac("sha256", b"job-secret", b"checkpoint-salt", iterations)


# ---------------------------------------------------------------- checkpoint_one_rank
def build_state_dict(total_mb: int) -> "dict[str, torch.Tensor]":
    """A fake model state dict: float32 tensors of 1-4 MB each, ``total_mb`` MB in all."""
    state, left, i = {}, total_mb, 0
    while left > 0:
        mb = min(1 + i % 4, left)
        state[f"layers.{i}.weight"] = torch.randn(mb * (1 << 18))  # 4 bytes per element
        left, i = left - mb, i + 1
    return state


def save_checkpoint(state: "dict[str, torch.Tensor]", path: str) -> None:
    with open(path, "wb") as fh:
        for name, tensor in state.items(): fh.write(tensor.numpy().tobytes())  # noqa: E701


# ---------------------------------------------------------------- evaluation_one_rank
def evaluate_from_storage(path: str) -> torch.Tensor:
    """Stream the eval set from storage in 256 KiB reads; the 'metrics' are size and checksum."""
    nbytes, crc = 0, 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(256 << 10)
            if not chunk:
                break
            nbytes, crc = nbytes + len(chunk), zlib.crc32(chunk, crc)
    return torch.tensor([float(nbytes), float(crc)], dtype=torch.float64)


# ---------------------------------------------------------------- pool_preprocess
def tokenize(text: str) -> "list[int]":
    """A toy byte-pair tokenizer in pure Python: CPU-bound, no I/O."""
    ids = [ord(c) for c in text]
    for _ in range(6):
        merged, i = [], 0
        while i < len(ids):
            if i + 1 < len(ids) and (ids[i] + ids[i + 1]) % 3 == 0:
                merged.append((ids[i] * 31 + ids[i + 1]) % 50_000)
                i += 2
            else:
                merged.append(ids[i])
                i += 1
        ids = merged + [(x * 7 + 1) % 50_000 for x in merged[: len(ids) // 2]]
    return ids


def make_corpus(rows: int, seed: int = 0) -> "list[str]":
    rng = random.Random(seed)
    words = ["the", "model", "gradient", "token", "layer", "batch", "loss", "rank", "shard"]
    return [" ".join(rng.choice(words) for _ in range(200)) for _ in range(rows)]


def rows_per_second(fn, rows: "list") -> float:
    start = time.perf_counter()
    for row in rows:
        fn(row)
    return len(rows) / (time.perf_counter() - start)


def tokenize_dataset(seconds: float) -> int:
    """Tokenize the corpus with a pool of 2 forked workers, about half a second a round."""
    end = time.monotonic() + seconds
    per_round = max(4, int(rows_per_second(tokenize, make_corpus(8))))
    corpus, tokens = make_corpus(per_round), 0
    with multiprocessing.get_context("fork").Pool(2) as pool:
        while time.monotonic() < end:
            tokens += sum(map(len, pool.map(tokenize, corpus, chunksize=4)))
    return tokens


# ---------------------------------------------------------------- datasets_map
def add_token_ids(example: dict) -> dict:
    return {"input_ids": tokenize(example["text"])}


def preprocess_dataset(seconds: float) -> int:
    """``datasets.Dataset.map(num_proc=2)`` over a fake corpus, ~0.5 s a round, until the time is up."""
    end = time.monotonic() + seconds
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets
    datasets.disable_caching()
    datasets.utils.logging.disable_progress_bar()
    per_round = max(8, int(rows_per_second(tokenize, make_corpus(8))))
    raw, rows = datasets.Dataset.from_dict({"text": make_corpus(per_round)}), 0
    while time.monotonic() < end:
        rows += len(raw.map(add_token_ids, num_proc=2, remove_columns=["text"]))
    return rows


# ---------------------------------------------------------------- dataloader_workers
class AugmentedImages(torch.utils.data.Dataset):
    """Fake 32x32 'images' made and augmented in pure Python in __getitem__ (CPU-heavy)."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = random.Random(index)
        pixels = [rng.random() for _ in range(32 * 32)]
        for _ in range(20):  # jitter + blur passes
            pixels = [(p * 0.9 + q * 0.1) * (1.0 + (rng.random() - 0.5) * 0.01)
                      for p, q in zip(pixels, pixels[1:] + pixels[:1])]
        return torch.tensor(pixels).reshape(1, 32, 32)


def compute_dataset_statistics(seconds: float) -> torch.Tensor:
    """Mean pixel over batches from a DataLoader with 2 workers until the time is up."""
    loader = torch.utils.data.DataLoader(AugmentedImages(), batch_size=16, num_workers=2)
    total, batches, end = 0.0, 0, time.monotonic() + seconds
    for batch in loader:
        total, batches = total + batch.mean().item(), batches + 1
        if time.monotonic() >= end:
            break
    return torch.tensor([total / max(batches, 1)])


# ---------------------------------------------------------------- slow_storage_load
def load_shards(path: str) -> int:
    """Read this rank's model shards from (slow) storage, 1 MiB at a time, until EOF."""
    shards = []
    with open(path, "rb") as fh:
        while True:
            data = fh.read(1 << 20)
            if not data:
                break
            shards.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return sum(s.numel() for s in shards)


# ---------------------------------------------------------------- the phase
def phase_ranks(kind: str) -> "set[int]":
    spec = os.environ.get("PHASE_RANKS", "0" if kind in ONE_RANK_KINDS else "all")
    if spec.strip() == "all":
        return set(range(dist.get_world_size()))
    return {int(r) for r in spec.split(",") if r.strip()}


def slow_path(kind: str) -> str:
    return os.environ.get(f"SLOW_PATH_{kind.upper()}", SLOW_PATH)


def run_phase(kind: str, ranks: "set[int]") -> None:
    """Run phase ``kind`` on the ranks in ``ranks``; the others wait in the collective that
    ends it."""
    rank, busy = dist.get_rank(), dist.get_rank() in ranks
    metrics, path = torch.zeros(1), slow_path(kind)
    if busy and kind == "c_extension_call":  # calibrated under the load the phase will see,
        # with room: under a CPU burner the 0.3 s sample may see more contention than the call
        pbkdf2_iterations = calibrate_pbkdf2(1.5 * PHASE_SECONDS)
    start = time.monotonic()
    if busy:
        log(f"{kind}: started at {time.time():.3f}")
    if kind == "matmul_loop":
        metrics = evaluate_retrieval(PHASE_SECONDS) if busy else metrics
        dist.all_reduce(metrics)
    elif kind == "long_forward":
        metrics = evaluate(PHASE_SECONDS) if busy else metrics
        dist.all_reduce(metrics)
    elif kind == "c_extension_call":
        if busy:
            derive_checkpoint_key(pbkdf2_iterations)
        dist.barrier()
    elif kind == "checkpoint_one_rank":
        if busy:
            save_checkpoint(build_state_dict(PHASE_MB), path)
        dist.barrier()
    elif kind == "evaluation_one_rank":
        src = min(ranks)
        metrics = torch.zeros(2, dtype=torch.float64)
        if rank == src:
            metrics = evaluate_from_storage(path)
        dist.broadcast(metrics, src=src)
    elif kind == "pool_preprocess":
        if busy:
            tokenize_dataset(PHASE_SECONDS)
        dist.barrier()
    elif kind == "datasets_map":
        if busy:
            preprocess_dataset(PHASE_SECONDS)
        dist.barrier()
    elif kind == "dataloader_workers":
        metrics = compute_dataset_statistics(PHASE_SECONDS) if busy else metrics
        dist.all_reduce(metrics)
    elif kind == "slow_storage_load":
        if busy:
            load_shards(f"{path}.{rank}")
        dist.barrier()
    else:
        raise SystemExit(f"unknown PHASE {kind!r}")
    log(f"{kind}: {'done' if busy else 'waited'} in {time.monotonic() - start:.2f} s"
        f" at {time.time():.3f}")


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = nn.Linear(64, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 4):
        train_step(model, optimizer, step)
    for number, kind in enumerate(PHASES):
        run_phase(kind, phase_ranks(kind))
        first = 4 + number * STEPS_AFTER
        for step in range(first, first + STEPS_AFTER):
            train_step(model, optimizer, step)
    dist.destroy_process_group()
    # torch 2.13's own exit race (seen here in 2 of 12 plain torchrun runs of this scenario under
    # load, no stalldoc): the phases are what this scenario is about, so it leaves without it
    leave()


if __name__ == "__main__":
    main()
