"""SD407 num-generations."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import plan_of


class NumGenerations(Rule):
    """num_generations below 2.

    What it does
        Before launch, for a swift GRPO command: num_generations must be at least 2 (unless a
        teacher model is set).

    Why is this bad?
        GRPO's advantage compares completions within a group; a group of one has no baseline,
        so swift refuses it — after loading the model, with a message older versions worded as
        a divisibility error (a community article quotes "1 x 1 must be evenly divisible by 1").

    Evidence
        num_generations.

    Fix
        Set num_generations to 2 or more (4 or more for stable training, as a community article on
        swift GRPO recommends), with the batch sizes adjusted so that the generation batch still
        divides (SD406).

    References
        the community articles "GRPO fine-tuning of DeepSeek-R1-Distill-Qwen-7B in Swift" and "Swift
        GRPO on a single GPU: parameter settings" (Chinese, 2025); swift ``num_generations must be
        greater than 1 for GRPO``.
    """

    code = "SD407"
    name = "num-generations"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        plan = plan_of(window)
        config = window.config
        if plan is None or config is None or config.value("teacher_model"):
            return
        if plan.num_generations < 2:
            yield self.finding((), "num_generations must be greater than 1 for GRPO",
                               {"num_generations": plan.num_generations})
