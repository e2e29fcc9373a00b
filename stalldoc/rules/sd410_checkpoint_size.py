"""SD410 checkpoint-size."""
from __future__ import annotations

import math
from typing import Iterator

from stalldoc.launch.config import number
from stalldoc.launch.plan import setting
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import plan_of
from stalldoc.rules.telemetry import gib

OPTIMIZER_BYTES_PER_PARAM = 12   # fp32 Adam m and v, and fp32 master weights
SWIFT_SAVE_STEPS = 500


class CheckpointSize(Rule):
    """Full fine-tuning keeps every checkpoint at full size, with no limit on how many.

    What it does
        Before launch, for a swift GRPO command with tuner_type full (3.x: train_type), saving on,
        and no save_total_limit (or one <= 0, which transformers reads as none): estimates one
        checkpoint (weights in their dtype, plus the optimizer state unless save_only_model) from
        the local model's config.json, and the disk for all checkpoints when max_steps is known.

    Why is this bad?
        A LoRA adapter is megabytes; a full checkpoint of a 7B model is 15 GB of weights and ~85 GB
        more with optimizer state (a community article on swift GRPO saw the model grow from 15 GB
        to 43 GB). Without save_total_limit they pile up until the disk is full, and a write to a
        full disk blocks or fails the job mid-run.

    Evidence
        parameters, weights and optimizer bytes per checkpoint, checkpoints expected, total.

    Fix
        Set save_total_limit (e.g. 2), and save_only_model true unless you resume from checkpoints;
        or train LoRA (tuner_type lora) when full fine-tuning is not needed.

    References
        the community article "GRPO fine-tuning of DeepSeek-R1-Distill-Qwen-7B in Swift" (Chinese,
        2025); swift arguments save_total_limit, save_only_model.
    """

    code = "SD410"
    name = "checkpoint-size"
    severity = Severity.WARNING
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config, res = window.config, window.resources
        if config is None or res is None or res.model is None or not config.is_grpo:
            return
        if (config.value("tuner_type") or "lora") != "full" \
                or (number(config, "save_total_limit") or 0) > 0 \
                or (config.value("save_strategy") or "steps") == "no":
            return
        weights = res.model.weight_bytes
        optimizer = 0 if config.flag("save_only_model") else res.model.params * \
            OPTIMIZER_BYTES_PER_PARAM
        plan = plan_of(window)
        every = number(config, "save_steps") or SWIFT_SAVE_STEPS
        count = checkpoints(plan.max_steps, every) if plan and plan.max_steps else None
        total = f"; {count} checkpoints = {gib(count * (weights + optimizer))}" if count else ""
        yield self.finding((), f"full fine-tuning without save_total_limit: one checkpoint "
                               f"{gib(weights)} weights + {gib(optimizer)} optimizer state{total}",
                           {"params": res.model.params, "weights_bytes": weights,
                            "optimizer_bytes": optimizer, "checkpoints": count,
                            "save_steps": int(every) if every >= 1 else every,
                            "epochs": setting(config, "num_train_epochs")})


def checkpoints(max_steps: int, save_steps: float) -> int:
    """Checkpoints written in ``max_steps``: every ``save_steps`` steps, or every that share of
    max_steps when below 1 (transformers)."""
    every = math.ceil(save_steps * max_steps) if save_steps < 1 else int(save_steps)
    return math.ceil(max_steps / max(every, 1))
