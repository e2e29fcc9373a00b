"""SD205 gpu-shared-by-ranks."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MIN_SAMPLES, gib, recent


class GpuSharedByRanks(Rule):
    """Processes of several ranks share one GPU.

    What it does
        Every tick, over the last 30 s of NVML samples: flags a GPU whose process list holds
        processes of two or more different ranks in every sample (a rank's own children, such as
        its vLLM workers, count for that rank).

    Why is this bad?
        Two ranks on one GPU split its memory and compute: each gets half the KV cache and the
        step time of the slowest GPU doubles; with vLLM engines (num_infer_workers x
        tensor_parallel_size larger than the GPUs) they also contend for the same memory at
        wake-up, which is where colocate runs hang or OOM.

    Evidence
        the GPU, the ranks and processes on it, its memory in use.

    Fix
        Give each rank its own GPU: NPROC_PER_NODE = GPUs per node, num_infer_workers x
        tensor_parallel_size <= GPUs, CUDA_VISIBLE_DEVICES listing distinct GPUs, and
        ``torch.cuda.set_device(LOCAL_RANK)`` in every rank.

    References
        ms-swift issue #3695 (a hang; a comment's command line runs num_infer_workers 8 with
        tensor_parallel_size 8, undiagnosed there); community articles on
        swift GRPO (Chinese, 2025) on tensor_parallel_size x num_infer_workers.
    """

    code = "SD205"
    name = "gpu-shared-by-ranks"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        for index, history in sorted(window.gpus.items()):
            samples = recent(history, window.now)
            if len(samples) < MIN_SAMPLES or any(len(s.ranks) < 2 for s in samples):
                continue
            last = samples[-1]
            pids = {str(p.pid): p.rank for p in last.processes or ()}
            yield self.finding(last.ranks, (
                f"GPU {index} is shared by ranks {', '.join(map(str, last.ranks))} "
                f"({len(pids)} processes, {gib(last.memory_used)} in use)"),
                {"gpu": index, "processes": pids, "memory_used": last.memory_used})
