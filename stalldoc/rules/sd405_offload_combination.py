"""SD405 offload-combination."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.config import deepspeed_of
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule


class OffloadCombination(Rule):
    """offload_model with ZeRO-3 CPU offload: a configuration reported to stall 32B GRPO runs.

    What it does
        Before launch, for a swift GRPO command: offload_model (or offload_optimizer) together
        with ``--deepspeed zero3_offload`` or a DeepSpeed JSON that offloads parameters or the
        optimizer to CPU / NVMe.

    Why is this bad?
        Both move the same weights and states over PCIe every step, one for rollout, one for
        ZeRO-3's own offload; on a large model the GPU waits on the bus most of the step (offload
        thrash, SD201), which looks like a hang.

    Evidence
        offload_model, offload_optimizer, deepspeed.

    Fix
        In this order, measuring the step time after each: turn offload_model off first, then
        offload_optimizer; use zero3 instead of zero3_offload when GPU memory allows; set
        move_model_batches; empty the CUDA cache after offload (gc_collect_after_offload in swift
        3.x).

    References
        the community article "Swift GRPO training of a 32B model hangs" (Chinese, 2025); ms-swift
        GRPO docs; issue #3401 (zero3_offload + async_generate).
    """

    code = "SD405"
    name = "offload-combination"
    severity = Severity.WARNING
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config = window.config
        if config is None or not config.is_grpo:
            return
        deepspeed = deepspeed_of(config)
        moving = [name for name in ("offload_model", "offload_optimizer") if config.flag(name)]
        if moving and deepspeed and (deepspeed.offload_param or deepspeed.offload_optimizer):
            yield self.finding((), f"{' and '.join(moving)} with --deepspeed {deepspeed.name} "
                                   f"(ZeRO-{deepspeed.stage} offload): weights cross PCIe twice "
                                   "per step", {
                                       "offload_model": config.flag("offload_model"),
                                       "offload_optimizer": config.flag("offload_optimizer"),
                                       "deepspeed": deepspeed.name, "stage": deepspeed.stage,
                                       "ds_offload_param": deepspeed.offload_param,
                                       "ds_offload_optimizer": deepspeed.offload_optimizer})
