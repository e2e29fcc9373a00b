"""SD505 cumem-allocator-error."""
from __future__ import annotations

from stalldoc.model import Severity
from stalldoc.rules.log_signature import LogSignature


class CumemAllocatorError(LogSignature):
    """vLLM's sleep-mode allocator (cumem) failed.

    What it does
        Matches errors raised from vLLM's ``cumem_allocator.cpp``.

    Why is this bad?
        The cumem allocator maps and unmaps the engine's memory on sleep / wake-up; when it fails in
        colocate mode the engine is left half asleep and the rank hangs at the next rollout.

    Evidence
        the lines, the ranks that printed them.

    Fix
        Lower vllm_gpu_memory_utilization or sleep_level, make sure nothing else holds the memory
        being woken into (offload the training model first), or upgrade vLLM; without a fix,
        disable sleep mode.

    References
        ms-swift issue #9144 (vLLM-side colocate hang with a cumem_allocator.cpp error).
    """

    code = "SD505"
    name = "cumem-allocator-error"
    severity = Severity.ERROR
    headline = "vLLM cumem allocator error"
    patterns = (
        r"cumem_allocator\.cpp",
    )
    fix = ("Lower vllm_gpu_memory_utilization or sleep_level, offload the training model before waking "
           "vLLM, or upgrade vLLM; otherwise disable sleep mode.")
