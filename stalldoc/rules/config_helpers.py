"""What the launch rules (SD4xx) share: the job's GPUs at launch, and its GRPO plan."""
from __future__ import annotations

from stalldoc.launch.plan import GrpoPlan, grpo_plan
from stalldoc.model import Window


def visible_gpus(window: Window) -> int | None:
    """GPUs the job can use: CUDA_VISIBLE_DEVICES when set, else the GPUs NVML sees (or the
    user said), else None."""
    config = window.config
    listed = config.env.get("CUDA_VISIBLE_DEVICES") if config else None
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip() and d.strip() != "-1"])
    if window.gpus:
        return len(window.gpus)
    return window.resources.gpus if window.resources else None


def plan_of(window: Window) -> GrpoPlan | None:
    """The GRPO plan of the window's command (None: not GRPO or world size unknown)."""
    if window.config is None:
        return None
    size = window.resources.dataset_size if window.resources else None
    return grpo_plan(window.config, size)
