"""SD504 expandable-segments-pool."""
from __future__ import annotations

from stalldoc.model import Severity
from stalldoc.rules.log_signature import LogSignature


class ExpandableSegmentsPool(LogSignature):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments meets vLLM's memory pool.

    What it does
        Matches ``Expandable segments are not compatible with memory pool``.

    Why is this bad?
        vLLM sleep mode allocates from its own memory pool; with expandable segments on, the
        allocator refuses and the rollout engine fails (often swallowed, then a hang).

    Evidence
        the lines, the ranks that printed them.

    Fix
        Remove ``expandable_segments:True`` from PYTORCH_CUDA_ALLOC_CONF when vLLM sleep mode
        (sleep_level) is on, or turn sleep mode off.

    References
        ms-swift GRPO docs; PyTorch CUDA allocator configuration.
    """

    code = "SD504"
    name = "expandable-segments-pool"
    severity = Severity.ERROR
    headline = "expandable segments with vLLM's memory pool"
    patterns = (
        r"Expandable segments are not compatible with memory pool",
    )
    fix = ("Remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF while vLLM sleep mode "
           "(sleep_level) is on, or turn sleep mode off.")
