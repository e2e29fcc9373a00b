"""SD121 driver-spins."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule


class DriverSpins(Rule):
    """The driver (or an actor that is no rank) burns CPU in one place while every rank waits.

    What it does
        Every tick, while every rank of a Ray job idles in its task loop (or, in a Ray job with
        no rank, while nothing else of it works), finds the driver or an actor that is no rank
        busy on the CPU in a working frame whose stack keeps the same functions (an
        expression's own frames, a generator or a comprehension, left out) for
        ``--busy-timeout`` (default 600 s, at least twice the stall timeout). It works, so it
        is never a stall: a warning, never a reason to end the job, resolved once that stack
        moves on. Not sooner: a reward model computing in torch's C++ shows py-spy the same
        single Python frame a loop that never ends does.

    Why is this bad?
        The ranks only work when the driver hands them a batch. Driver code that spins in
        place (a normaliser with no fixed point, a retry loop, a regular expression that
        backtracks without end) holds every GPU of the job idle; the driver looks busy, so
        nothing looks stalled.

    Evidence
        the process (driver or actor class, pid), its frame and frames, how long its stack has
        stayed the same.

    Fix
        Read the frame: a loop that should end needs an exit condition or a limit (a fixed-point
        iteration on NaN never converges: check the input); an expected long computation in
        one place holds every GPU idle meanwhile: move it off the driver, or raise
        `--busy-timeout`.

    References
        verl PR#6673 (a reward normalisation extremely slow on a degenerate sample: the driver
        computes on); SD109 for a rank that spins.
    """

    code = "SD121"
    name = "driver-spins"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        others = ("every rank waits for its next task" if window.ranks else
                  "nothing else of the job works (it has no rank)")
        for seen in window.spinning:
            main = seen.stacks.main if seen.stacks else None
            summary = (f"{seen.process.label} has been busy in one unchanging stack for "
                       f"{seen.busy_for:.0f} s at {seen.frame or 'an unknown frame'} while "
                       f"{others}: a loop that never ends?")
            yield self.finding([], summary, {
                "pid": seen.process.pid, "role": seen.process.role,
                "actor_class": seen.process.actor_class,
                "frame": str(seen.frame) if seen.frame else None,
                "frames": [str(f) for f in main.frames] if main else [],
                "busy_seconds": seen.busy_for, "busy_timeout": window.busy_timeout})
