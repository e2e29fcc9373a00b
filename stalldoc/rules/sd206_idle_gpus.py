"""SD206 idle-gpus."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MIN_SAMPLES, mean, recent

BUSY_PERCENT = 30.0


class IdleGpus(Rule):
    """Some GPUs of the node do nothing while the job's GPUs work.

    What it does
        Every tick, over the last 30 s: when the job's GPUs (those with a rank's process) are
        busy on average and other GPUs of the node have no process at all, the idle GPUs are
        named, with the number of ranks against the number of GPUs.

    Why is this bad?
        NPROC_PER_NODE (or --nproc_per_node, or CUDA_VISIBLE_DEVICES) smaller than the GPUs
        leaves hardware unused and makes every step slower than planned; in swift it also changes
        the world size that batch sizes and num_generations must divide, and the max_steps the
        run was planned with.

    Evidence
        the idle GPUs, the busy ones with their ranks and utilisation, ranks and GPUs counted.

    Fix
        Set NPROC_PER_NODE (torchrun --nproc_per_node) to the GPUs per node and check
        CUDA_VISIBLE_DEVICES; then recompute the per-device batch sizes and num_generations so that
        the global batch still divides, and max_steps for the new world size.

    References
        community articles on swift GRPO (Chinese, 2025): NPROC_PER_NODE, batch size divisibility,
        max_steps; ms-swift issue #3401 (uneven NPROC_PER_NODE across nodes).
    """

    code = "SD206"
    name = "idle-gpus"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        histories = {i: recent(h, window.now) for i, h in window.gpus.items()}
        if not histories or any(len(h) < MIN_SAMPLES for h in histories.values()):
            return
        used = {i: h for i, h in histories.items() if all(s.ranks for s in h)}
        idle = sorted(i for i, h in histories.items() if all(not s.processes for s in h))
        busy = {i: mean(s.util_gpu for s in h) for i, h in used.items()}
        if not idle or not busy or any(u is None or u < BUSY_PERCENT for u in busy.values()):
            return
        ranks = sorted({r for h in used.values() for r in h[-1].ranks})
        yield self.finding(ranks, (
            f"GPUs {', '.join(map(str, idle))} idle while {len(ranks)} ranks keep GPUs "
            f"{', '.join(map(str, sorted(used)))} busy: {len(ranks)} ranks on "
            f"{len(histories)} GPUs"),
            {"idle_gpus": idle, "busy_gpus": {str(i): round(u or 0, 1) for i, u in busy.items()},
             "ranks": len(ranks), "gpus": len(histories)})
