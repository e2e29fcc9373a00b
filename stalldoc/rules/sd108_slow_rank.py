"""SD108 slow-rank."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.model.work import RankWork
from stalldoc.rules.base import Rule, join_ranks, phase_of


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def waiting_at(window: Window, ranks: list[int]) -> str:
    """'wait in barrier #12 (group world)' from the agents' rings, when they say it."""
    places: dict[str, list[int]] = {}
    for rank in ranks:
        agent = window.agents.get(rank)
        pending = agent.pending if agent else ()
        where = (f"wait in {pending[0].op} #{pending[0].seq} (group {pending[0].group})"
                 if pending else "show no work")
        places.setdefault(where, []).append(rank)
    return "; ".join(f"{join_ranks(r)} {where}" for where, r in places.items())


class SlowRank(Rule):
    """Some ranks work on without progress while the others wait for them: slow, not hung.

    What it does
        Every tick, finds live ranks that show work (CPU in a working frame, bytes read or
        written, busy child processes, GPU) but have not moved a marker or a collective for
        longer than the stall timeout, while other ranks show no work at all. It says what the
        slow rank is doing and how fast, and where the others wait. A warning at most; it is
        resolved when the slow rank's phase ends, and it is never a reason for
        ``--on-stall kill``.

    Why is this bad?
        It is not a hang: one rank alone saves a checkpoint, runs evaluation, preprocesses data
        or loads a model while the others wait in a barrier. It costs the waiting ranks' GPUs
        that long, and if the phase keeps growing it can outlast the collective timeout.

    Evidence
        per slow rank: phase, frame, seconds without progress, CPU %, I/O rate, children and
        their CPU, GPU utilisation; the waiting ranks and the collective they wait in.

    Fix
        Expected work (checkpoint, evaluation, preprocessing, model load) needs nothing: stalldoc
        does not call it a stall. To shorten it, spread it over all ranks (sharded checkpoints,
        distributed evaluation) or move it off the critical path (asynchronous checkpointing), and
        keep the collective timeout (``--ddp_timeout``, ``timeout=`` of init_process_group) longer
        than it.

    References
        "slow, not hung": DeepSpeed ZeRO-3 checkpoint saves on rank 0 (deepspeedai/DeepSpeed
        issues), evaluation on rank 0 under DDP (pytorch/pytorch "barrier timeout during
        evaluation").
    """

    code = "SD108"
    name = "slow-rank"
    severity = Severity.WARNING
    trigger = "tick"
    ends_with_progress = True

    def check(self, window: Window) -> Iterator[Finding]:
        slow = sorted(r for r, w in window.work.items()
                      if w.working and not w.progressed and w.since_progress >= window.floor)
        idle = sorted(r for r, w in window.work.items() if w.verdict == "idle")
        if not slow or not idle:
            return
        doing = "; ".join(self._doing(window, r, window.work[r]) for r in slow)
        yield self.finding(slow, f"{doing}; {waiting_at(window, idle)}", {
            "ranks": {str(r): self._evidence(window, r, window.work[r]) for r in slow},
            "waiting_ranks": idle, "phase": phase_of(window, slow[0]),
            "frame": window.work[slow[0]].frame, "frames": []})

    @staticmethod
    def _doing(window: Window, rank: int, work: RankWork) -> str:
        where = phase_of(window, rank) or work.frame or "its current work"
        return (f"rank {rank} has been in {where} for {_minutes(work.since_progress)} without "
                f"progress, {work.reason}")

    @staticmethod
    def _evidence(window: Window, rank: int, work: RankWork) -> dict:
        return {"phase": phase_of(window, rank), "frame": work.frame, "seen": work.describe(),
                "reason": work.reason, "seconds_without_progress": work.since_progress,
                "cpu_percent": work.cpu_percent, "io_bps": work.io_bps,
                "children": work.children, "children_cpu_percent": work.children_cpu_percent,
                "gpu_util": work.gpu_util}
