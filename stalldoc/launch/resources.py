"""What the node and the files offer a job before it starts: GPUs and their memory (NVML, else
the user's word), and the dataset's size (a local file, else the user's word)."""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass

from stalldoc.launch.config import LaunchConfig


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "bf16": 2, "fp16": 2, "float32": 4,
                "float": 4, "fp32": 4}


@dataclass(frozen=True)
class ModelInfo:
    """Sizes read from a local model directory's config.json."""

    params: int                  # estimated parameter count
    layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int | None
    dtype_bytes: int             # of the weights as they will be loaded

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Resources:
    gpus: int | None = None
    gpu_memory: int | None = None        # bytes per GPU
    dataset_size: int | None = None      # rows of the training dataset(s)
    dataset_note: str = ""               # where dataset_size came from, or why it is unknown
    model: ModelInfo | None = None


def model_info(config: LaunchConfig) -> ModelInfo | None:
    """From ``--model DIR/config.json`` (a decoder-only transformer); None when not local."""
    directory = config.value("model")
    path = os.path.join(directory, "config.json") if directory else ""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            c = json.load(fh)
        return _estimate(c, config.value("torch_dtype"))
    except (OSError, ValueError, TypeError, KeyError, ZeroDivisionError):
        return None


def _estimate(c: dict, torch_dtype: str | None) -> ModelInfo:
    c = c.get("text_config", c)
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv, head_dim = c.get("num_key_value_heads") or heads, c.get("head_dim") or h // heads
    experts = c.get("num_experts") or c.get("num_local_experts") or 1
    inter = c.get("moe_intermediate_size") if experts > 1 else None
    inter = inter or c.get("intermediate_size") or 4 * h
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    params = layers * (attention + 3 * h * inter * experts) + vocab * h * (
        1 if c.get("tie_word_embeddings") else 2)
    dtype = torch_dtype or c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    return ModelInfo(params, layers, kv, head_dim, c.get("max_position_embeddings"),
                     _DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2))


def count_rows(path: str) -> int:
    """Rows of a local JSONL / JSON list / CSV dataset file."""
    if path.endswith((".jsonl", ".jsonlines")):
        with open(path, encoding="utf-8") as fh:
            return sum(1 for line in fh if line.strip())
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return len(data) if isinstance(data, list) else 1
    if path.endswith((".csv", ".tsv")):
        with open(path, encoding="utf-8", newline="") as fh:
            return max(0, sum(1 for _ in csv.reader(fh)) - 1)
    raise ValueError(f"unknown dataset format: {path}")


def dataset_size(config: LaunchConfig) -> tuple[int | None, str]:
    """Rows over every ``--dataset`` entry (``path#N`` takes N rows), if all can be counted."""
    entries = config.args.get("dataset", ())
    if not entries:
        return None, "no --dataset"
    total = 0
    for entry in entries:
        path, _, sample = entry.partition("#")
        if sample.isdigit():
            total += int(sample)
            continue
        if not os.path.isfile(path):
            return None, f"{path} is not a local file (give --dataset-size)"
        try:
            total += count_rows(path)
        except (OSError, ValueError) as exc:
            return None, f"cannot count {path}: {exc}"
    return total, "counted from " + ", ".join(entries)
