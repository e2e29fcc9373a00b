"""SD505 cumem-allocator-error."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class CumemAllocatorError(LogSignature):
    """vLLM's sleep-mode allocator (cumem) failed, or is missing.

    What it does
        Matches errors raised from vLLM's ``cumem_allocator.cpp`` (``CUDA Error: out of memory at
        .../cumem_allocator.cpp:56``) and ``cumem allocator is not available`` (vllm-ascend:
        ``camem``), the sleep-mode errors of colocate GRPO.

    Why is this bad?
        The cumem allocator maps and unmaps the engine's memory on sleep / wake-up; when it fails in
        colocate mode the engine is left half asleep (older vLLM went on and crashed later in a
        memcpy) and the rank hangs at the next rollout. Without the allocator, sleep mode cannot
        start at all.

    Evidence
        the lines, the ranks that printed them.

    Fix
        ``out of memory`` at wake-up: the training side still holds the memory: set --offload_model
        true and --offload_optimizer true, and lower --vllm_gpu_memory_utilization. ``invalid
        argument``: upgrade vLLM. ``allocator is not available``: reinstall vLLM with it; until then
        --sleep_level 0.

        ``invalid argument``: vLLM's wake-up error handling was reworked in later versions.
        ``allocator is not available``: vLLM was built without its memory pool allocator
        (vllm-ascend: reinstall with COMPILE_CUSTOM_KERNELS=1).

    References
        modelscope/ms-swift#9613 (colocate GRPO of a MoE model fails with ``CUDA Error: invalid
        argument at /workspace/csrc/cumem_allocator.cpp:119``; its reporter had first asked in
        ms-swift#9144, a colocate hang with no error printed),
        vllm-project/vllm#12981 (the wake-up OOM lines), vllm-project/vllm-ascend#556.
    """

    code = "SD505"
    name = "cumem-allocator-error"
    severity = Severity.ERROR
    headline = "vLLM cumem allocator error"
    patterns = (
        r"cumem_allocator\.cpp",
        r"c[au]mem allocator is not available",
    )
