"""SD510 vllm-preemption."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.log_signature import LogSignature
from stalldoc.rules.telemetry import gib


class VllmPreemption(LogSignature):
    """vLLM preempts sequences because its KV cache is full.

    What it does
        Matches vLLM's ``Sequence group ... is preempted by PreemptionMode.RECOMPUTE mode because
        there is not enough KV cache space`` and the V1 engine's preemption warnings. vLLM's V1
        engine (0.32 seen) prints none when it preempts: its preemptions are counted by the
        agent instead and reported by SD530.

    Why is this bad?
        Each preempted sequence is thrown away and recomputed: rollouts slow down by multiples
        and look like a stall, while — with vllm_gpu_memory_utilization set low for a large
        model — GPU memory sits unused next to the full KV cache.

    Evidence
        the lines and how often they came; the memory each GPU had unused at that moment
        (NVML), which says whether raising vllm_gpu_memory_utilization has room to work.

    Fix
        Raise --vllm_gpu_memory_utilization towards 0.6-0.7 when the GPU has memory to spare
        (colocate: offload the training model during rollout first, --offload_model true), or lower
        --vllm_max_num_seqs / --vllm_max_model_len, or raise --vllm_tensor_parallel_size.

    References
        the community article "Swift GRPO training of a 32B model hangs" (Chinese, 2025; 32B with
        vllm_gpu_memory_utilization 0.5); vLLM docs on preemption; GAIR-NLP/LIMO#29 (a 32B
        evaluation, 101 cumulative preemptions).
    """

    code = "SD510"
    name = "vllm-preemption"
    severity = Severity.WARNING
    headline = "vLLM KV cache full, sequences preempted"
    patterns = (
        r"is preempted by PreemptionMode\.(?P<mode>\w+) mode because there is not enough KV "
        r"cache space",
        r"not enough KV cache space",
    )

    def check(self, window: Window) -> Iterator[Finding]:
        unused = {str(i): h[-1].memory_total - h[-1].memory_used for i, h in window.gpus.items()
                  if h and h[-1].memory_total and h[-1].memory_used is not None}
        for finding in super().check(window):
            if unused:
                spare = ", ".join(f"GPU {i} {gib(v)}" for i, v in unused.items())
                finding = dataclasses.replace(
                    finding, summary=f"{finding.summary[:160]}; unused: {spare}",
                    evidence={**finding.evidence, "gpu_unused_bytes": unused})
            yield finding
