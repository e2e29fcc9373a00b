"""SD406 generation-batch."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import divisors, listing, plan_of


TOO_SMALL_FIX = ("Make the generation batch at least num_generations ({g}) completions: raise "
                 "per_device_train_batch_size, gradient_accumulation_steps (steps_per_generation) "
                 "or NPROC_PER_NODE so that B x W x S is a multiple of {g}.")


class GenerationBatch(Rule):
    """The generation batch does not split into whole groups of num_generations (or into whole
    global batches).

    What it does
        Before launch, computes swift 4.x's generation batch Gb = per_device_train_batch_size x
        world size x steps_per_generation (or the generation_batch_size given) and checks what
        swift checks after loading the model: Gb divisible by the global batch B x W, and by
        num_generations, listing the valid values (the first 24, found in bounded time).

    Why is this bad?
        swift raises only after minutes of model loading (as community articles on swift GRPO
        report); batch sizes count completions, not prompts, which is what users get wrong.

    Evidence
        B, W, S, Gb, num_generations, the valid num_generations values (the first 24, and
        whether that is all).

    Fix
        Choose num_generations among the valid values (the finding lists them), or change
        per_device_train_batch_size, gradient_accumulation_steps (steps_per_generation) or
        NPROC_PER_NODE so that B x W x S is a multiple of num_generations.

    References
        swift rlhf_trainers/args_mixin.py ``_init_generation_batch_params``; the community articles
        "GRPO parameters for a 32B model in Swift" and "Swift GRPO on a single GPU: parameter
        settings" (Chinese, 2025).
    """

    code = "SD406"
    name = "generation-batch"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        plan = plan_of(window)
        if plan is None:
            return
        gbs, g = plan.generation_batch_size, plan.num_generations
        evidence = {"per_device_train_batch_size": plan.per_device_train_batch_size,
                    "world_size": plan.world_size, "steps_per_generation": plan.steps_per_generation,
                    "generation_batch_size": gbs, "num_generations": g}
        if gbs % plan.global_batch_size:
            yield self.finding((), f"generation_batch_size ({gbs}) must be divisible by the "
                                   f"global batch size ({plan.global_batch_size}).", evidence)
        elif g > 1 and gbs % g:
            valid, complete = divisors(gbs, start=2)
            head = (f"generation_batch_size ({gbs}) must be evenly divisible by num_generations "
                    f"({g}).")
            evidence = {**evidence, "valid": valid, "valid_complete": complete}
            if valid:
                yield self.finding((), f"{head} Valid values: {listing(valid, complete)}.",
                                   evidence)
            else:       # a generation batch of 1: no group of 2 or more fits in it
                yield self.finding((), f"{head} No num_generations of 2 or more divides {gbs}.",
                                   evidence, fix=TOO_SMALL_FIX.format(g=g))
