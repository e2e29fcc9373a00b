"""SD109 busy-without-progress."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, phase_of


class BusyWithoutProgress(Rule):
    """A rank burns CPU in one unchanging stack, with nothing else moving, for a long time.

    What it does
        Every tick, finds ranks that have been busy on the CPU in a working (not waiting) frame
        whose stack keeps the same functions, with no marker or collective progress, no I/O, no
        GPU work and no child processes, for longer than ``--busy-timeout`` (default 600 s, at
        least twice the stall timeout). A warning: stalldoc never ends the job for it.

    Why is this bad?
        Real work moves something sooner or later: bytes, the GPU, a collective, a marker, a
        log line. A loop that only burns CPU in place for many minutes may be a livelock (a
        retry loop, a spin on a flag that never flips, a regex backtracking without end) that
        the stall detector cannot call a hang, because the rank does look busy.

    Evidence
        the rank, its frame and phase, CPU %, how long its stack has stayed the same.

    Fix
        Read the frame: a loop that should end (a retry, a spin on a flag, a regular expression)
        needs an exit condition or a timeout; an expected long CPU-only computation needs a larger
        ``--busy-timeout``.

    References
        py-spy dump of a spinning process; "livelock" in the stall detector's design notes.
    """

    code = "SD109"
    name = "busy-without-progress"
    severity = Severity.WARNING
    trigger = "tick"
    ends_with_progress = True

    def check(self, window: Window) -> Iterator[Finding]:
        busy = sorted(r for r, w in window.work.items()
                      if w.busy_unchanged >= window.busy_timeout)
        if not busy:
            return
        first = window.work[busy[0]]
        where = ", ".join(f"rank {r} in {window.work[r].frame or 'an unknown frame'} "
                          f"({window.work[r].cpu_percent or 0:.0f}% CPU)" for r in busy)
        summary = (f"{join_ranks(busy)} busy in the same stack for {first.busy_unchanged:.0f} s "
                   f"with no progress, I/O, GPU work or child processes: {where}; a possible "
                   f"livelock")
        yield self.finding(busy, summary, {
            "frame": first.frame, "frames": [], "phase": phase_of(window, busy[0]),
            "busy_seconds": {str(r): window.work[r].busy_unchanged for r in busy},
            "cpu_percent": {str(r): window.work[r].cpu_percent for r in busy},
            "busy_timeout": window.busy_timeout})
