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
class PlanSymbol:
    """One letter of the arithmetic: what it stands for, its value, and where the value comes
    from ('' when given on the command line)."""

    symbol: str
    meaning: str
    value: str
    source: str = ""


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
    symbols: tuple[PlanSymbol, ...] = ()     # what the letters of ``arithmetic`` stand for
    defaults: tuple[str, ...] = ()           # arguments not given: swift's defaults were used


def setting(config: LaunchConfig, name: str) -> float:
    value = number(config, name)
    return value if value is not None else float(DEFAULTS[name])


def train_prompts(dataset_size: int | None, config: LaunchConfig) -> int | None:
    """Prompts left for training after swift splits off its validation share."""
    if dataset_size is None:
        return None
    ratio = setting(config, "split_dataset_ratio")
    return dataset_size - int(dataset_size * ratio) if ratio > 0 else dataset_size


def plural(count: int | float, word: str) -> str:
    """'1 completion', '4 completions'."""
    return f"{count:g} {word}" if count == 1 else f"{count:g} {word}s"


def _world(config: LaunchConfig) -> tuple[int | None, str]:
    """The world size the plan uses and where it comes from."""
    if config.world_size is not None:
        nodes = config.nnodes or 1
        return config.world_size, (f"{config.nproc_per_node} processes per node x {nodes} nodes"
                                   if nodes > 1 else "processes per node")
    if config.launcher == "swift":
        return 1, "NPROC_PER_NODE not set: swift runs one process"
    if config.launcher == "python":
        return 1, "a plain python command: one process"
    return None, ""


def _symbols(config: LaunchConfig, values: dict[str, float], world_source: str,
             n: int | None, dataset_note: str, dataset_size: int | None) -> list[PlanSymbol]:
    """The letters, their values and where each value comes from."""
    def source(name: str) -> str:
        return "" if name in config.args else "swift's default"

    s_source = ("" if "steps_per_generation" in config.args else
                "generation_batch_size / (B*W)" if "generation_batch_size" in config.args
                else "swift's default: GA")
    ratio = setting(config, "split_dataset_ratio")
    n_source = dataset_note if n is None else (
        f"{dataset_size} rows, {ratio * 100:g}% held out (split_dataset_ratio)" if ratio > 0
        else "the dataset's rows" + (f" ({dataset_note})" if dataset_note else ""))
    return [PlanSymbol("B", "per_device_train_batch_size", f"{values['b']:g}",
                       source("per_device_train_batch_size")),
            PlanSymbol("W", "world size (processes)", f"{values['w']:g}", world_source),
            PlanSymbol("GA", "gradient_accumulation_steps", f"{values['ga']:g}",
                       source("gradient_accumulation_steps")),
            PlanSymbol("S", "steps_per_generation", f"{values['s']:g}", s_source),
            PlanSymbol("G", "num_generations", f"{values['g']:g}", source("num_generations")),
            PlanSymbol("I", "num_iterations", f"{values['i']:g}", source("num_iterations")),
            PlanSymbol("E", "num_train_epochs", f"{values['e']:g}", source("num_train_epochs")),
            PlanSymbol("N", "train prompts", "unknown" if n is None else str(n), n_source)]


def _generation_line(b: int, world: int, s: int, gbs: int, g: int, given: bool) -> str:
    """The generation batch, in completions and, when they divide, whole prompts."""
    head = (f"generation batch Gb = {plural(gbs, 'completion')} (generation_batch_size)" if given
            else f"generation batch Gb = B*W*S = {b}*{world}*{s} = {plural(gbs, 'completion')}")
    if gbs % g == 0:
        return f"{head} = {plural(gbs // g, 'prompt')} x {plural(g, 'generation')}"
    return f"{head}: not a whole number of prompts of G = {g} generations (see SD406)"


def grpo_plan(config: LaunchConfig, dataset_size: int | None,
              dataset_note: str = "") -> GrpoPlan | None:
    """The plan of a swift GRPO command whose world size is known; None otherwise. Raises
    BadArgument (launch/arguments.py) when a number it needs is out of range, as parse_command
    has then said in ``config.error``; within range every step is finite. ``dataset_note``
    says where ``dataset_size`` comes from, or why it is unknown."""
    world, world_source = _world(config)
    if not config.is_grpo or world is None:
        return None
    b, ga = int(setting(config, "per_device_train_batch_size")), \
        int(setting(config, "gradient_accumulation_steps"))
    g, i = int(setting(config, "num_generations")), int(setting(config, "num_iterations"))
    epochs = setting(config, "num_train_epochs")
    gbs_given = number(config, "generation_batch_size")
    s_given = number(config, "steps_per_generation")
    s = int(s_given) if s_given else (int(gbs_given) // (b * world) if gbs_given else ga)
    gbs = int(gbs_given) if gbs_given else b * world * s
    lines = [f"global batch B*W = {b}*{world} = {plural(b * world, 'completion')}",
             _generation_line(b, world, s, gbs, g, bool(gbs_given))]
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
    values = {"b": b, "w": world, "ga": ga, "s": s, "g": g, "i": i, "e": epochs}
    symbols = _symbols(config, values, world_source, n, dataset_note, dataset_size)
    defaults = tuple(name for name in DEFAULTS if name not in config.args)
    return GrpoPlan(world, b, ga, s, b * world, gbs, g, i, gbs / g, n, epochs, rollouts,
                    steps_epoch, max_steps, given is not None and given > 0, tuple(lines),
                    tuple(symbols), defaults)
