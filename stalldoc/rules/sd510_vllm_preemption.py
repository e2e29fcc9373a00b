"""SD510 vllm-preemption."""
from __future__ import annotations

from stalldoc.model import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmPreemption(LogSignature):
    """vLLM preempts sequences because its KV cache is full.

    What it does
        Matches vLLM's ``Sequence group ... is preempted by PreemptionMode.RECOMPUTE mode because
        there is not enough KV cache space`` and the V1 engine's preemption warnings.

    Why is this bad?
        Each preempted sequence is thrown away and recomputed: rollouts slow down by multiples
        and look like a stall, while — with vllm_gpu_memory_utilization set low for a large
        model — GPU memory sits unused next to the full KV cache.

    Evidence
        the lines and how often they came.

    Fix
        Raise vllm_gpu_memory_utilization towards 0.6-0.7 when the GPU has memory to spare
        (colocate: offload the training model during rollout first), or lower
        vllm_max_num_seqs / vllm_max_model_len, or raise vllm_tensor_parallel_size.

    References
        seed article 002 (32B with vllm_gpu_memory_utilization 0.5); vLLM docs on preemption.
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
    fix = ("Raise vllm_gpu_memory_utilization towards 0.6-0.7 if the GPU has memory to spare "
           "(offload the training model during rollout first), or lower vllm_max_num_seqs / "
           "vllm_max_model_len, or raise vllm_tensor_parallel_size.")
