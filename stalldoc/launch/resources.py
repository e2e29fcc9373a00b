"""What the node and the files offer a job before it starts: GPUs and their memory (NVML, else
the user's word), and the dataset's size (a local file, else the user's word)."""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass

from stalldoc.launch.config import LaunchConfig


@dataclass(frozen=True)
class Resources:
    gpus: int | None = None
    gpu_memory: int | None = None        # bytes per GPU
    dataset_size: int | None = None      # rows of the training dataset(s)
    dataset_note: str = ""               # where dataset_size came from, or why it is unknown


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
