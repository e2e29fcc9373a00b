"""SD408 eval-batch."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.config import number
from stalldoc.launch.plan import setting
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import divisors, listing, plan_of


class EvalBatch(Rule):
    """The global eval batch does not split into groups of num_generations_eval.

    What it does
        Before launch, when evaluation will run (a val_dataset, or split_dataset_ratio > 0, and
        eval_strategy not "no"): world size x per_device_eval_batch_size must be divisible by
        num_generations_eval (default num_generations), as swift checks.

    Why is this bad?
        swift refuses it after loading the model; a community article recommends
        per_device_eval_batch_size = num_generations for this reason.

    Evidence
        world size, per_device_eval_batch_size, num_generations_eval, the valid values (the
        first 24, and whether that is all).

    Fix
        Make world size x per_device_eval_batch_size a multiple of num_generations_eval (e.g.
        per_device_eval_batch_size = num_generations), or choose num_generations_eval among the
        valid values (the finding lists them).

    References
        swift rlhf_trainers/args_mixin.py; the community article "GRPO parameters for a 32B model in
        Swift" (Chinese, 2025).
    """

    code = "SD408"
    name = "eval-batch"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        plan, config = plan_of(window), window.config
        if plan is None or config is None or plan.num_generations < 2:
            return
        evaluates = config.value("val_dataset") or setting(config, "split_dataset_ratio") > 0
        if not evaluates or (config.value("eval_strategy") or "steps") == "no":
            return
        per_device = int(setting(config, "per_device_eval_batch_size"))
        g_eval = int(number(config, "num_generations_eval") or plan.num_generations)
        total = plan.world_size * per_device
        if total % g_eval:
            valid, complete = divisors(total)
            yield self.finding((), f"The global eval batch size ({plan.world_size} x {per_device}) "
                                   f"must be evenly divisible by num_generations_eval ({g_eval}). "
                                   f"Valid values: {listing(valid, complete)}.",
                               {"world_size": plan.world_size, "per_device_eval_batch_size":
                                per_device, "num_generations_eval": g_eval, "valid": valid,
                                "valid_complete": complete})
