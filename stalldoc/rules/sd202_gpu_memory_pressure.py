"""SD202 gpu-memory-pressure."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import RECENT_SECONDS, gib, gpus_of

FRAGMENTED = 1.5      # reserved / allocated
NEAR_FULL = 0.9       # of the GPU's memory


class GpuMemoryPressure(Rule):
    """GPU memory at the edge without an OOM: the allocator retries, or holds much more than it
    uses.

    What it does
        Every tick, per rank with CUDA telemetry: flags allocation retries that rose in the last
        30 s (the caching allocator had to free its cache and try again), or a reserved pool
        over 1.5 x the allocated memory while the GPU is over 90 % full (fragmentation).

    Why is this bad?
        Each retry synchronises the device and empties the cache: steps slow down by seconds
        and a colocated vLLM engine finds no room for its KV cache. Fragmentation makes the next
        large allocation (a rollout batch, a gathered ZeRO-3 layer) fail or stall.

    Evidence
        retries at the start and end of the window, allocated / reserved / peak, the GPU's used
        and total memory.

    Fix
        Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (not with vLLM sleep mode: see SD504),
        empty the CUDA cache (``torch.cuda.empty_cache()``) after offload / rollout, or lower
        vllm_gpu_memory_utilization and the batch / sequence lengths.

    References
        PyTorch CUDA memory management (memory_stats, num_alloc_retries); ms-swift GRPO docs.
    """

    code = "SD202"
    name = "gpu-memory-pressure"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, history in sorted(window.cuda.items()):
            recent = [(t, c) for t, c in history if window.now - t <= RECENT_SECONDS
                      and c.alloc_retries is not None]
            if not recent:
                continue
            first, last = recent[0][1], recent[-1][1]
            used, total = self._gpu_memory(window, rank)
            retried = (last.alloc_retries or 0) > (first.alloc_retries or 0)
            fragmented = (last.allocated and last.reserved and total and used is not None
                          and last.reserved >= FRAGMENTED * last.allocated
                          and used >= NEAR_FULL * total)
            if not (retried or fragmented):
                continue
            what = (f"{(last.alloc_retries or 0) - (first.alloc_retries or 0)} allocation retries "
                    f"in {recent[-1][0] - recent[0][0]:.0f} s" if retried else
                    f"reserved {gib(last.reserved)} for {gib(last.allocated)} allocated")
            yield self.finding([rank], f"rank {rank} GPU memory pressure: {what}; GPU "
                                       f"{gib(used)} of {gib(total)} used", {
                "alloc_retries": [first.alloc_retries, last.alloc_retries],
                "allocated": last.allocated, "reserved": last.reserved,
                "peak_allocated": last.peak_allocated, "gpu_used": used, "gpu_total": total})

    @staticmethod
    def _gpu_memory(window: Window, rank: int) -> tuple[int | None, int | None]:
        for samples in gpus_of(window, rank).values():
            return samples[-1].memory_used, samples[-1].memory_total
        return None, None
