"""SD404 processes-vs-gpus."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import visible_gpus


class ProcessesVsGpus(Rule):
    """The processes per node do not match the GPUs of the node.

    What it does
        Before launch, when both are known (NPROC_PER_NODE / --nproc_per_node, and the GPUs
        from CUDA_VISIBLE_DEVICES or NVML): more processes than GPUs is an error; GPUs not a
        multiple of the processes is swift's ``AssertionError: n_gpu: 8, local_world_size: 3``;
        fewer processes than GPUs leaves GPUs idle (a warning).

    Why is this bad?
        Extra processes share GPUs (memory contention, hangs at vLLM wake-up); swift refuses a
        GPU count that is not a multiple; too few processes waste GPUs and change the world size
        the batch sizes and max_steps were planned for.

    Evidence
        processes per node, GPUs, nodes.

    Fix
        Set NPROC_PER_NODE to the GPUs per node (or list exactly the GPUs to use in
        CUDA_VISIBLE_DEVICES), then recompute batch sizes, num_generations and max_steps for that
        world size.

    References
        the community articles "GRPO parameters for a 32B model in Swift" and "Swift GRPO on a
        single GPU: parameter settings" (Chinese, 2025: NPROC_PER_NODE); ms-swift device checks.
    """

    code = "SD404"
    name = "processes-vs-gpus"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config = window.config
        nproc, gpus = (config.nproc_per_node if config else None), visible_gpus(window)
        if not nproc or not gpus or nproc == gpus:
            return
        evidence = {"nproc_per_node": nproc, "gpus": gpus, "nnodes": config.nnodes or 1}
        if nproc > gpus:
            yield self.finding((), f"{nproc} processes per node for {gpus} GPUs: GPUs shared",
                               evidence)
        elif gpus % nproc:
            yield self.finding((), f"n_gpu: {gpus}, local_world_size: {nproc}: {gpus} GPUs are "
                                   f"not a multiple of {nproc} processes", evidence)
        else:
            yield self.finding((), f"{nproc} processes per node for {gpus} GPUs: "
                                   f"{gpus - nproc} GPUs idle", evidence, severity=Severity.WARNING)
