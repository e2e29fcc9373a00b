"""What the launch rules (SD4xx) share: the job's GPUs at launch, its GRPO plan, and the valid
values of a divisibility rule, listed in bounded time whatever the number."""
from __future__ import annotations

import math

from stalldoc.launch.plan import GrpoPlan, grpo_plan
from stalldoc.model.window import Window

DIVISORS_SHOWN = 24          # valid values listed at most
_TRIALS_MAX = 10**5          # trial divisions at most: numbers up to 10**10 are listed in full


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
    """The GRPO plan of the window's command (None: not GRPO or world size unknown); raises
    BadArgument when a number the plan needs is out of range."""
    if window.config is None:
        return None
    size = window.resources.dataset_size if window.resources else None
    return grpo_plan(window.config, size)


def divisors(n: int, start: int = 1) -> tuple[list[int], bool]:
    """The divisors of ``n >= 1`` from ``start`` up, ascending: at most DIVISORS_SHOWN of them,
    and whether that is all of them. At most min(sqrt(n), 10**5) divisions, so 10**30 is as
    quick as 24."""
    root = math.isqrt(n)
    limit = min(root, _TRIALS_MAX)
    small: list[int] = []
    for d in range(1, limit + 1):
        if n % d == 0:
            small.append(d)
            if sum(1 for x in small if x >= start) > DIVISORS_SHOWN:
                return [x for x in small if x >= start][:DIVISORS_SHOWN], False
    if limit < root:                  # divisors between 10**5 and n / 10**5 not looked for
        return [x for x in small if x >= start][:DIVISORS_SHOWN], False
    values = [x for x in small + [n // d for d in reversed(small) if n // d != d] if x >= start]
    return values[:DIVISORS_SHOWN], len(values) <= DIVISORS_SHOWN


def listing(values: list[int], complete: bool) -> str:
    """``[2, 3, 4]``, or ``[2, 3, 4, ...]`` when there are more than listed."""
    return "[" + ", ".join([*map(str, values), *([] if complete else ["..."])]) + "]"
