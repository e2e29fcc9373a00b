"""SD301 host-memory-pressure."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MIN_SAMPLES, gib, mean, recent

LOW_AVAILABLE = 0.05          # of total memory
SWAPPING_BPS = 32 * 2**20     # swap in + out, bytes per second


class HostMemoryPressure(Rule):
    """The node is short of memory or swapping.

    What it does
        Every tick, over the last 30 s of node samples: flags available memory below 5 % of the
        total, or swap traffic (in + out) above 32 MiB/s in most samples. Names the ranks with
        the largest resident memory and whether it grew.

    Why is this bad?
        CPU offload (offload_optimizer, zero3_offload, offload_model) keeps optimizer states and
        weights in host memory; when the node runs short, pages go to swap and every offload
        step crawls at disk speed — the job looks hung with the GPUs idle — until the OOM killer
        takes a rank (SD103).

    Evidence
        available and total memory, lowest available in the window, mean swap in/out rate, the
        largest ranks' RSS at the start and end of the window.

    Fix
        Offload less (zero3 instead of zero3_offload when GPU memory allows; offload_model before
        offload_optimizer), run fewer ranks or dataloader workers per node, or give the node more
        memory; never rely on swap for offloaded states: it makes every offload step crawl.

    References
        community articles on swift GRPO (Chinese, 2025) on offload; DeepSpeed ZeRO-Offload docs.
    """

    code = "SD301"
    name = "host-memory-pressure"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        nodes = recent(window.node, window.now)
        if len(nodes) < MIN_SAMPLES:
            return
        last = nodes[-1]
        low = last.available_bytes < LOW_AVAILABLE * last.total_bytes
        swapping = [n for n in nodes if (n.swap_in_bps or 0) + (n.swap_out_bps or 0) >= SWAPPING_BPS]
        if not low and len(swapping) * 2 <= len(nodes):
            return
        ranks = sorted(window.host, key=lambda r: -window.host[r][-1].rss_bytes)[:3]
        growth = {str(r): [window.host[r][0].rss_bytes, window.host[r][-1].rss_bytes]
                  for r in ranks}
        what = (f"{gib(last.available_bytes)} of {gib(last.total_bytes)} available" if low
                else f"swapping {gib(mean(n.swap_in_bps for n in nodes))}/s in, "
                     f"{gib(mean(n.swap_out_bps for n in nodes))}/s out")
        yield self.finding(ranks, f"host memory pressure: {what}; largest ranks {ranks}", {
            "available_bytes": last.available_bytes, "total_bytes": last.total_bytes,
            "min_available_bytes": min(n.available_bytes for n in nodes),
            "swap_in_bps": mean(n.swap_in_bps for n in nodes),
            "swap_out_bps": mean(n.swap_out_bps for n in nodes), "rss_first_last": growth})
