"""SD402 vllm-tp-layout."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.config import number
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import divisors, listing, visible_gpus


class VllmTpLayout(Rule):
    """vLLM's tensor parallelism does not fit the ranks or the GPUs.

    What it does
        Before launch, for a swift GRPO command with vLLM: vllm_tensor_parallel_size must divide
        the world size (NPROC_PER_NODE x NNODES); with swift 3.x's num_infer_workers,
        num_infer_workers x vllm_tensor_parallel_size must not exceed the GPUs of a node.

    Why is this bad?
        swift refuses a TP size that does not divide the world size, after loading the model
        (``vllm_tensor_parallel_size (tp) must divide world size (W) evenly.``). More engine
        shards than GPUs put several on one GPU: they contend for its memory at wake-up and the
        colocated run hangs or OOMs.

    Evidence
        tensor parallel size, world size (and its divisors, the first 24), num_infer_workers,
        GPUs.

    Fix
        Choose vllm_tensor_parallel_size among the divisors of the world size (the finding lists
        them), and keep num_infer_workers x vllm_tensor_parallel_size within the GPUs of a node.

    References
        ms-swift GRPO argument checks; issue #3695 (a hang; a comment's command line
        runs num_infer_workers 8 with tensor_parallel_size 8, undiagnosed there).
    """

    code = "SD402"
    name = "vllm-tp-layout"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config = window.config
        if config is None or not config.is_grpo or not config.flag("use_vllm"):
            return
        tp = int(number(config, "vllm_tensor_parallel_size") or 1)
        world = config.world_size
        if world and world % tp:
            valid, complete = divisors(world)
            yield self.finding((), f"vllm_tensor_parallel_size ({tp}) must divide world size "
                                   f"({world}) evenly; valid: {listing(valid, complete)}",
                               {"tensor_parallel_size": tp, "world_size": world,
                                "valid": valid, "valid_complete": complete})
        workers, gpus = number(config, "num_infer_workers"), visible_gpus(window)
        if workers and gpus and workers * tp > gpus:
            yield self.finding((), f"num_infer_workers {workers:.0f} x vllm_tensor_parallel_size "
                                   f"{tp} = {workers * tp:.0f} engine shards on {gpus} GPUs",
                               {"num_infer_workers": int(workers), "tensor_parallel_size": tp,
                                "gpus": gpus})
