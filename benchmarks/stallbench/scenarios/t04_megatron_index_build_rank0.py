"""Healthy: rank 0 builds the GPT dataset's index maps for a minute while rank 1 waits in a barrier

source: https://github.com/NVIDIA/Megatron-LM/issues/795, https://github.com/NVIDIA/Megatron-LM/pull/4080
shape: Megatron-style start-up on 2 ranks: no cached index maps, so rank 0 builds the document,
  sample and shuffle indices with numpy (shuffling every epoch's documents, cumsum of sizes) and
  saves them as .npy; the other rank waits in torch.distributed.barrier(), then both load the maps
  and train
launch: torchrun 2
truth: healthy
needs: torch, numpy
budget: 120
"""
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import jobkit

SEQ_LENGTH = 128


def _build_doc_idx(documents: np.ndarray, num_epochs: int, rng: np.random.RandomState) -> np.ndarray:
    doc_idx = np.tile(documents, num_epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def _build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray) -> np.ndarray:
    ends = np.cumsum(sizes[doc_idx], dtype=np.int64)
    starts = np.arange(0, int(ends[-1]) - SEQ_LENGTH, SEQ_LENGTH, dtype=np.int64)
    return np.searchsorted(ends, starts, side="right").astype(np.int32)


def _build_index_mappings(prefix: str, sizes: np.ndarray, seconds: float) -> None:
    """As many epochs of the corpus as the training run needs (here: as a 60 s budget allows)."""
    print(" > WARNING: could not find index map files, building the indices on rank 0 ...", flush=True)
    rng, started, epochs = np.random.RandomState(1234), time.time(), 0
    documents = np.arange(len(sizes), dtype=np.int32)
    sample_counts = []
    while time.time() - started < seconds:
        doc_idx = _build_doc_idx(documents, 1, rng)
        sample_idx = _build_sample_idx(sizes, doc_idx)
        shuffle_idx = rng.permutation(len(sample_idx)).astype(np.int64)
        sample_counts.append(len(shuffle_idx))
        epochs += 1
    np.save(prefix + "_doc_idx.npy", doc_idx, allow_pickle=False)
    np.save(prefix + "_sample_idx.npy", sample_idx, allow_pickle=False)
    np.save(prefix + "_shuffle_idx.npy", shuffle_idx, allow_pickle=False)
    print(f" > elasped time to build and save doc-idx mapping (seconds): {time.time() - started:.2f}"
          f" ({epochs} epochs, {sum(sample_counts)} samples)", flush=True)


def main() -> None:
    rank, world = jobkit.init()
    prefix = os.path.join(os.getcwd(), "gpt_train_indexmap")
    sizes = np.random.RandomState(0).randint(20, 600, size=2_000_000).astype(np.int32)
    jobkit.hang_begins("rank 0 builds the index maps; the other rank waits in the barrier")
    if rank == 0:
        _build_index_mappings(prefix, sizes, seconds=60.0)
    dist.barrier()
    shuffle_idx = np.load(prefix + "_shuffle_idx.npy", mmap_mode="r")
    print(f"rank {rank}: loaded shuffle-idx mapping with {len(shuffle_idx)} samples", flush=True)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(1024, 32), torch.nn.Linear(32, 1024)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(10):
        tokens = torch.from_numpy(np.asarray(shuffle_idx[step * 8:(step + 1) * 8]) % 1024)
        loss = torch.nn.functional.cross_entropy(model(tokens), tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        jobkit.step(step)
    dist.barrier()
    if rank == 0:
        for name in ("doc", "sample", "shuffle"):
            os.remove(f"{prefix}_{name}_idx.npy")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
