"""What the command line, the node and the files say before launch (read by launch/)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


_TRUE = {"true", "1", "yes", "on"}


@dataclass(frozen=True)
class LaunchConfig:
    """What the watched command line and its environment say (read by launch/config.py; its
    numbers are read and checked by ``launch.config.number``)."""

    launcher: str               # swift / torchrun / deepspeed / accelerate / python / other
    program: str                                    # the training script or module
    swift_command: str | None                       # rlhf, sft, rollout, ... (None: not swift)
    args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    nproc_per_node: int | None = None
    nnodes: int | None = None
    error: str = ""             # why part of the command could not be read or used (one line)

    def value(self, name: str) -> str | None:
        values = self.args.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        """A boolean flag: given bare or with true/1/yes/on."""
        values = self.args.get(name)
        return values is not None and (not values or values[-1].lower() in _TRUE)

    @property
    def is_grpo(self) -> bool:
        return self.swift_command == "rlhf" and (self.value("rlhf_type") or "") == "grpo"

    @property
    def world_size(self) -> int | None:
        if self.nproc_per_node is None:
            return None
        return self.nproc_per_node * (self.nnodes or 1)


@dataclass(frozen=True)
class ModelInfo:
    """Sizes read from a local model directory's config.json."""

    params: int                  # estimated parameter count
    layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int | None
    dtype_bytes: int             # of the weights as they will be loaded
    model_type: str = ""         # config.json's model_type (qwen2, qwen3_moe, ...); "" unknown

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
    model_note: str = ""                 # where model came from, or why it is unknown
    # the frameworks installed for the command's interpreter (package -> version; empty:
    # unknown), and where they were read or why not
    versions: Mapping[str, str] = field(default_factory=dict)
    versions_note: str = ""
