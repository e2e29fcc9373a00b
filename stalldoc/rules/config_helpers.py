"""What the launch rules (SD4xx) share: the job's GPUs as the node shows them at launch."""
from __future__ import annotations

from stalldoc.model import Window


def visible_gpus(window: Window) -> int | None:
    """GPUs the job can use: CUDA_VISIBLE_DEVICES when set, else the GPUs NVML sees, else None."""
    config = window.config
    listed = config.env.get("CUDA_VISIBLE_DEVICES") if config else None
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip() and d.strip() != "-1"])
    return len(window.gpus) or None
