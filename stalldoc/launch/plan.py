"""The GRPO step arithmetic of swift (../shared/notes/swift.md), as a plan with its working shown.

B = per_device_train_batch_size, W = world size, GA = gradient_accumulation_steps,
S = steps_per_generation (default GA), Gb = generation_batch_size (default B*W*S),
G = num_generations, I = num_iterations, N = train prompts, E = num_train_epochs.
Rollouts per epoch R = floor(N*G / Gb); dataloader length R*I*S; steps per epoch
ceil(R*I*S / GA); max_steps = ceil(E * steps per epoch), unless --max_steps is given.
Batch sizes count completions, not prompts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from stalldoc.launch.config import LaunchConfig, number

# swift 4.x defaults for GRPO (trainers/arguments.py, arguments/rlhf_args.py)
DEFAULTS = {"per_device_train_batch_size": 1, "per_device_eval_batch_size": 1,
            "gradient_accumulation_steps": 1, "num_generations": 8, "num_iterations": 1,
            "num_train_epochs": 3.0, "split_dataset_ratio": 0.0}


@dataclass(frozen=True)
class GrpoPlan:
    world_size: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    global_batch_size: int
    generation_batch_size: int
    num_generations: int
    num_iterations: int
    prompts_per_generation: float
    train_prompts: int | None
    num_train_epochs: float
    rollouts_per_epoch: int | None
    steps_per_epoch: int | None
    max_steps: int | None
    max_steps_given: bool
    arithmetic: tuple[str, ...]


def setting(config: LaunchConfig, name: str) -> float:
    value = number(config, name)
    return value if value is not None else float(DEFAULTS[name])


def train_prompts(dataset_size: int | None, config: LaunchConfig) -> int | None:
    """Prompts left for training after swift splits off its validation share."""
    if dataset_size is None:
        return None
    ratio = setting(config, "split_dataset_ratio")
    return dataset_size - int(dataset_size * ratio) if ratio > 0 else dataset_size


def grpo_plan(config: LaunchConfig, dataset_size: int | None) -> GrpoPlan | None:
    """The plan of a swift GRPO command whose world size is known; None otherwise. Raises
    BadArgument (launch/arguments.py) when a number it needs is out of range, as parse_command
    has then said in ``config.error``; within range every step is finite."""
    world = config.world_size or (1 if config.launcher in ("swift", "python") else None)
    if not config.is_grpo or world is None:
        return None
    b, ga = int(setting(config, "per_device_train_batch_size")), \
        int(setting(config, "gradient_accumulation_steps"))
    g, i = int(setting(config, "num_generations")), int(setting(config, "num_iterations"))
    epochs = setting(config, "num_train_epochs")
    gbs_given, s_given = number(config, "generation_batch_size"), number(config, "steps_per_generation")
    s = int(s_given) if s_given else (int(gbs_given) // (b * world) if gbs_given else ga)
    gbs = int(gbs_given) if gbs_given else b * world * s
    lines = [f"global batch B*W = {b}*{world} = {b * world} completions",
             f"generation batch Gb = B*W*S = {b}*{world}*{s} = {gbs} completions = "
             f"{gbs / g:g} prompts x {g} generations"]
    n = train_prompts(dataset_size, config)
    rollouts = steps_epoch = max_steps = None
    if n is not None and gbs > 0:
        rollouts = n * g // gbs
        steps_epoch = math.ceil(rollouts * i * s / ga)
        max_steps = math.ceil(epochs * steps_epoch)
        lines += [f"rollouts per epoch R = floor(N*G/Gb) = floor({n}*{g}/{gbs}) = {rollouts}",
                  f"steps per epoch = ceil(R*I*S/GA) = ceil({rollouts}*{i}*{s}/{ga}) = {steps_epoch}",
                  f"max_steps = ceil(E * steps per epoch) = ceil({epochs:g}*{steps_epoch}) = "
                  f"{max_steps}"]
    given = number(config, "max_steps")
    if given is not None and given > 0:
        max_steps = int(given)
        lines.append(f"max_steps = {max_steps} (given on the command line)")
    return GrpoPlan(world, b, ga, s, b * world, gbs, g, i, gbs / g, n, epochs, rollouts,
                    steps_epoch, max_steps, given is not None and given > 0, tuple(lines))
