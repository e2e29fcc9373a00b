"""SD527 deepspeed-cache-flushes."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class DeepspeedCacheFlushes(LogSignature):
    """DeepSpeed ZeRO-3 flushed torch's allocator cache during a step.

    What it does
        Matches ZeRO-3's ``N pytorch allocator cache flushes since last step. this happens when
        there is high memory pressure``.

    Why is this bad?
        A weak signal: each flush synchronises the device and frees cached blocks that must be
        allocated again; a rank that flushes while the others do not falls behind, and they wait
        for it in every all-gather. Steps slow by multiples, which looks like a stall, and it is
        often the step before an OOM.

    Evidence
        the lines, the number of flushes per step.

    Fix
        Lower memory per GPU: a smaller per_device_train_batch_size or max_length, gradient
        checkpointing, lower stage3_max_live_parameters / stage3_prefetch_bucket_size, or offload
        (zero3_offload / offload_optimizer). If flushes stay, call
        ``get_accelerator().empty_cache()`` at the same point of every rank's step, as DeepSpeed
        suggests, so that ranks flush together.

    References
        jzhang38/EasyContext#11, huggingface/peft#194, LLaVA-VL/LLaVA-NeXT#247.
    """

    code = "SD527"
    name = "deepspeed-cache-flushes"
    severity = Severity.INFO
    headline = "DeepSpeed flushing the allocator cache (memory pressure)"
    patterns = (
        r"(?P<flushes>\d+) pytorch allocator cache flushes since last step",
    )
