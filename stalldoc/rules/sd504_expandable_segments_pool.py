"""SD504 expandable-segments-pool."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class ExpandableSegmentsPool(LogSignature):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments meets vLLM's memory pool.

    What it does
        Matches ``Expandable segments are not compatible with memory pool`` and the assertion's
        source line a traceback shows (``assert "expandable_segments:True" not in conf``, vLLM's
        CuMemAllocator).

    Why is this bad?
        vLLM sleep mode allocates from its own memory pool; with expandable segments on, the
        allocator refuses and the rollout engine fails (often swallowed, then a hang).

    Evidence
        the lines, the ranks that printed them.

    Fix
        Remove ``expandable_segments:True`` from PYTORCH_CUDA_ALLOC_CONF while vLLM sleep mode
        (sleep_level) is on, or turn sleep mode off, or upgrade vLLM (>= 0.20.1 turns it off around
        its pool, per NovaSky-AI/SkyRL#1768).

    References
        OpenRLHF/OpenRLHF#1011 (the assertion with --colocate_all_models and vLLM sleep),
        vllm-project/vllm#14189 (the assertion), pytorch/pytorch#147851; ms-swift GRPO docs.
        vLLM releases after vllm-project/vllm#40812 switch expandable segments off around the pool
        themselves instead of failing.
    """

    code = "SD504"
    name = "expandable-segments-pool"
    severity = Severity.ERROR
    headline = "expandable segments with vLLM's memory pool"
    patterns = (
        r"Expandable segments are not compatible with memory pool",
        r"assert \"expandable_segments:True\" not in conf",
    )
