"""What the node and the files offer a job before it starts: GPUs and their memory (NVML, else
the user's word), the dataset's size (a local file, else the user's word) and the model's sizes
(a local config.json). Files are opened without blocking (launch/files.py); a file that cannot be
used leaves its quantity unknown, with the reason, and never raises."""
from __future__ import annotations

import csv
import io
import json
import os
import re
from typing import Any, BinaryIO, Iterator

from stalldoc.errors import one_line
from stalldoc.launch.files import (MODEL_CONFIG_LIMIT, chunks, open_regular, read_text, reason,
                                   shape)
from stalldoc.model.launch import LaunchConfig
from stalldoc.model.launch import ModelInfo as ModelInfo
from stalldoc.model.launch import Resources as Resources


DATASET_JSON_LIMIT = 64 << 20   # bytes: a .json dataset is parsed whole, so only this large
CSV_LINE_LIMIT = 16 << 20       # characters in one line of a .csv / .tsv dataset
ROWS_MAX = 10**12               # a ``path#N`` sample count larger than this is not believed
_SAMPLE = re.compile(r"[0-9]{1,13}")
# config.json fields: (key, largest believable value); optional ones may be absent, null or 0
_REQUIRED = (("hidden_size", 10**6), ("num_hidden_layers", 10**5), ("vocab_size", 10**8),
             ("num_attention_heads", 10**5))
_OPTIONAL = (("num_key_value_heads", 10**5), ("head_dim", 10**5), ("num_experts", 10**5),
             ("num_local_experts", 10**5), ("moe_intermediate_size", 10**7),
             ("intermediate_size", 10**7), ("max_position_embeddings", 10**9))

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "bf16": 2, "fp16": 2, "float32": 4,
                "float": 4, "fp32": 4}


def model_info(config: LaunchConfig) -> ModelInfo | None:
    """From ``--model DIR/config.json`` (a decoder-only transformer); None when not local or
    not usable."""
    return read_model(config)[0]

_MODEL_TYPE = re.compile(r"[a-z0-9_]{1,64}")


def read_model(config: LaunchConfig) -> tuple[ModelInfo | None, str]:
    """(sizes, where from) from ``--model DIR/config.json``, or (None, why not); never raises."""
    directory = config.value("model")
    if not directory:
        return None, "no --model"
    path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        return None, one_line(f"{directory} is not a local directory")
    try:
        return _estimate(json.loads(read_text(path, MODEL_CONFIG_LIMIT)),
                         config.value("torch_dtype")), f"read from {path}"
    except (OSError, ValueError, RecursionError) as exc:
        return None, one_line(f"cannot read {path}: {reason(exc)}")


def _text_config(doc: Any) -> dict[str, Any]:
    """config.json's object, or its language part's for a multimodal model; ValueError else."""
    if not isinstance(doc, dict):
        raise ValueError(f"the top level is {shape(doc)}, not an object")
    c = doc.get("text_config", doc)
    if not isinstance(c, dict):
        raise ValueError(f"text_config is {shape(c)}, not an object")
    return c


def _fields(c: dict[str, Any]) -> dict[str, int | None]:
    """The sizes config.json gives, each a whole number in its range (optional ones None when
    absent); ValueError naming the first that is not."""
    out: dict[str, int | None] = {}
    for key, high in _REQUIRED + _OPTIONAL:
        value = c.get(key)
        if not value and (key, high) in _OPTIONAL:
            out[key] = None
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise ValueError(f"{key} is {json.dumps(value)[:40]}, not a whole number from 1 "
                             f"to {high}")
        else:
            out[key] = value
    return out


def _estimate(doc: Any, torch_dtype: str | None) -> ModelInfo:
    c = _text_config(doc)
    f = _fields(c)
    h, layers, vocab, heads = (f["hidden_size"] or 0, f["num_hidden_layers"] or 0,
                               f["vocab_size"] or 0, f["num_attention_heads"] or 1)
    kv, head_dim = f["num_key_value_heads"] or heads, f["head_dim"] or max(h // heads, 1)
    experts = f["num_experts"] or f["num_local_experts"] or 1
    inter = f["moe_intermediate_size"] if experts > 1 else None
    inter = inter or f["intermediate_size"] or 4 * h
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    params = layers * (attention + 3 * h * inter * experts) + vocab * h * (
        1 if c.get("tie_word_embeddings") else 2)
    dtype = torch_dtype or c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    kind = doc.get("model_type") if isinstance(doc, dict) else None
    return ModelInfo(params, layers, kv, head_dim, f["max_position_embeddings"],
                     _DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2),
                     kind if isinstance(kind, str) and _MODEL_TYPE.fullmatch(kind) else "")


def _jsonl_rows(fh: BinaryIO) -> int:
    """Lines with anything but white space, read in chunks: a single 2 GB line costs no more
    memory than a chunk."""
    rows, filled = 0, False
    for chunk in chunks(fh):
        *ended, tail = chunk.split(b"\n")
        for line in ended:
            rows += bool(filled or line.strip())
            filled = False
        filled = filled or bool(tail.strip())
    return rows + filled


def _bounded_lines(fh: BinaryIO) -> Iterator[str]:
    """The file's lines as text, refusing one longer than CSV_LINE_LIMIT characters."""
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
    while line := text.readline(CSV_LINE_LIMIT + 1):
        if len(line) > CSV_LINE_LIMIT:
            raise ValueError(f"a line longer than {CSV_LINE_LIMIT >> 20} MiB")
        yield line


def count_rows(path: str) -> int:
    """Rows of a local JSONL / JSON list / CSV dataset file: only a regular file, never
    blocking, in bounded memory. Raises OSError / ValueError / csv.Error / RecursionError."""
    if not path.endswith((".jsonl", ".jsonlines", ".json", ".csv", ".tsv")):
        raise ValueError(f"unknown dataset format: {path}")
    with open_regular(path) as fh:
        if path.endswith((".jsonl", ".jsonlines")):
            return _jsonl_rows(fh)
        if path.endswith(".csv") or path.endswith(".tsv"):
            return max(0, sum(1 for _ in csv.reader(_bounded_lines(fh))) - 1)
        data = fh.read(DATASET_JSON_LIMIT + 1)
    if len(data) > DATASET_JSON_LIMIT:
        raise ValueError(f"larger than {DATASET_JSON_LIMIT >> 20} MiB, too large to count here")
    doc = json.loads(data)
    return len(doc) if isinstance(doc, list) else 1


def dataset_size(config: LaunchConfig) -> tuple[int | None, str]:
    """Rows over every ``--dataset`` entry (``path#N`` takes N rows), if all can be counted;
    else (None, why). Never raises."""
    entries = config.args.get("dataset", ())
    if not entries:
        return None, "no --dataset"
    total = 0
    for entry in entries:
        path, _, sample = entry.partition("#")
        if _SAMPLE.fullmatch(sample) and int(sample) <= ROWS_MAX:
            total += int(sample)
            continue
        if not os.path.exists(path):
            return None, f"{path} is not a local file (give --dataset-size)"
        try:
            total += count_rows(path)
        except (OSError, ValueError, csv.Error, RecursionError) as exc:
            return None, f"cannot count {path}: {reason(exc)} (give --dataset-size)"
    return total, "counted from " + ", ".join(entries)
