"""SD506 cuda-oom."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class CudaOom(LogSignature):
    """A CUDA out-of-memory error.

    What it does
        Matches ``CUDA out of memory. Tried to allocate X`` and ``torch.OutOfMemoryError``.

    Why is this bad?
        The rank dies, or (inside a rollout or a callback) the error is swallowed and its peers wait
        for it forever in the next collective.

    Evidence
        the lines, how much was requested, the ranks that printed them.

    Fix
        Lower vllm_gpu_memory_utilization, use sleep_level, move_model_batches, raise
        tensor_parallel_size, or reduce the per-device batch size / max lengths.

    References
        huggingface/trl#3172 (GRPO with LoRA and ZeRO-3 on 8xH100), huggingface/trl#2776;
        ms-swift GRPO docs; PyTorch CUDA memory management.
    """

    code = "SD506"
    name = "cuda-oom"
    severity = Severity.ERROR
    headline = "CUDA out of memory"
    patterns = (
        r"CUDA out of memory\. Tried to allocate (?P<requested>[\d.]+ [KMG]i?B)",
        r"torch\.(cuda\.)?OutOfMemoryError",
    )
