"""The tests' tiny random Qwen2 and byte-level BPE tokenizer (``tests/tiny_swift.py``: built
offline, with the arithmetic prompts the RL jobs train on), built once under ~/.cache/stallbench/
(a file lock keeps two ranks from building it at the same time). Head size 64 (hidden 128, 2
heads): vLLM's CPU attention needs 64 or more, so the same model serves TRL, swift, vLLM and Ray
jobs.

Run it alone to build the model and print its path: ``python tinymodel.py``.
"""
from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import tiny_swift  # noqa: E402
from tiny_swift import OFFLINE, questions, write_dataset  # noqa: E402,F401

CACHE = Path(os.environ.get("STALLBENCH_CACHE", Path.home() / ".cache" / "stallbench"))
MODEL_DIR = CACHE / "rl-qwen2-h128"


def offline() -> None:
    """Set the offline environment (no hub, no GPU) unless the caller set it already."""
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)


def build_model(directory: Path = MODEL_DIR, hidden: int = 128, heads: int = 2,
                layers: int = 2) -> Path:
    """Build the model once (atomic: built in a temporary folder, then renamed)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "model.safetensors").exists():
            temporary = directory.with_name(directory.name + f".tmp{os.getpid()}")
            tiny_swift.build_model(temporary, hidden, heads, layers)
            temporary.rename(directory)
    return directory


if __name__ == "__main__":
    offline()
    print(build_model())
