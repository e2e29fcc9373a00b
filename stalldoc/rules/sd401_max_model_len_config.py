"""SD401 max-model-len-config."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.config import number
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule

SWIFT_MAX_COMPLETION_LENGTH = 512   # swift's default max_completion_length


class MaxModelLenConfig(Rule):
    """vllm_max_model_len cannot hold a prompt plus its completion.

    What it does
        Before launch, for a swift GRPO command with vLLM: compares vllm_max_model_len with
        max_length (the longest prompt) + max_completion_length (default 512). A completion
        alone longer than the model length is an error; prompt + completion longer is a warning.

    Why is this bad?
        vLLM rejects prompts longer than max_model_len and clips completions at it: rewards of
        long samples collapse, or the rollout raises inside a callback and the rank waits
        forever.

    Evidence
        vllm_max_model_len, max_length, max_completion_length and their sum.

    Fix
        Set vllm_max_model_len >= max_length + max_completion_length, or lower max_length (with
        truncation_strategy) or max_completion_length.

    References
        community articles on swift GRPO (Chinese, 2025: vllm_max_model_len too small); ms-swift
        GRPO docs.
    """

    code = "SD401"
    name = "max-model-len-config"
    severity = Severity.WARNING
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config = window.config
        if config is None or not config.is_grpo or not config.flag("use_vllm"):
            return
        model_len = number(config, "vllm_max_model_len")
        if model_len is None:
            return
        completion = number(config, "max_completion_length") or SWIFT_MAX_COMPLETION_LENGTH
        prompt = number(config, "max_length")
        evidence = {"vllm_max_model_len": int(model_len), "max_length": prompt and int(prompt),
                    "max_completion_length": int(completion)}
        if completion >= model_len:
            yield self.finding((), (
                f"max_completion_length {completion:.0f} >= vllm_max_model_len {model_len:.0f}: "
                "no room for any prompt"), evidence, severity=Severity.ERROR)
        elif prompt is not None and prompt + completion > model_len:
            yield self.finding((), (
                f"max_length {prompt:.0f} + max_completion_length {completion:.0f} = "
                f"{prompt + completion:.0f} > vllm_max_model_len {model_len:.0f}"),
                {**evidence, "needed": int(prompt + completion)})
