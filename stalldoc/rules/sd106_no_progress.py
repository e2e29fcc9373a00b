"""SD106 no-progress."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.stacks import group_by_main_stack
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, describe, join_ranks, rank_evidence


def cpu_busy(window: Window, rank: int) -> float | None:
    """CPU seconds per second over the rank's last two host samples."""
    samples = window.host.get(rank, ())
    if len(samples) < 2 or samples[-1].t <= samples[-2].t:
        return None
    return round((samples[-1].cpu_seconds - samples[-2].cpu_seconds)
                 / (samples[-1].t - samples[-2].t), 2)


class NoProgress(Rule):
    """No rank made progress, and no more specific cause was found: where each rank is.

    What it does
        The fallback when no other rule explains a stall. Groups ranks by their main-thread
        stack; when the ranks split into groups, the smaller groups are named as suspects (the
        dominant group is usually the healthy waiters); with one group, every rank is named at
        its frame. A rank busy on the CPU in an unchanging frame is called out as spinning.

    Why is this bad?
        The job holds its resources and produces nothing; without this, the first sign is a
        collective timeout much later.

    Evidence
        per rank: frames, user frame, phase, seconds without progress, CPU use; the stack groups.

    Fix
        Read the named frame: give a blocking call (network, queue, file system, subprocess) a
        timeout, check a loop for an exit condition that can never become true, or find the process
        that holds the resource it waits for.

    References
        ByteRobust: stack traces grouped by string match, outliers are suspects.
    """

    code = "SD106"
    name = "no-progress"
    severity = Severity.WARNING
    fallback = True

    def check(self, window: Window) -> Iterator[Finding]:
        live = {r.rank for r in window.ranks} - {e.rank for e in window.exits}
        stacks = {r: s for r, s in window.stacks.items() if r in live}
        groups = group_by_main_stack(stacks)
        if not groups:
            suspects = sorted(live)
        elif len(groups) == 1:
            suspects = groups[0][1]
        else:
            suspects = sorted(r for _, ranks in groups[1:] for r in ranks)
        if not suspects:
            return
        spinning = [r for r in suspects if (cpu_busy(window, r) or 0) >= 0.5]
        where = "; ".join(f"rank {r} is {describe(window, r)}" for r in suspects)
        summary = f"no progress on any rank; {where}"
        if spinning:
            summary += f" ({join_ranks(spinning)} busy on the CPU without leaving the frame)"
        yield self.finding(suspects, summary, {
            **rank_evidence(window, suspects[0]),
            "cpu": {str(r): cpu_busy(window, r) for r in suspects},
            "stack_groups": [sorted(ranks) for _, ranks in groups],
            "ranks": {str(r): rank_evidence(window, r) for r in suspects}})
