"""SD104 python-deadlock."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.stacks import frame_strings, waits_on_lock
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, phase_of, stuck_for


class PythonDeadlock(Rule):
    """A rank's main thread waits on a lock, condition or join that nothing releases.

    What it does
        In the stacks taken at the stall, finds ranks whose main thread is idle on a lock
        acquisition (``lock.acquire()``, ``with lock:``, ``Condition.wait``, ``Thread.join``).
        Other threads of the same rank blocked on locks are named as the likely holders
        (a lock-order deadlock); otherwise the holder is not visible from the stacks.

    Why is this bad?
        The rank never reaches its next collective; every other rank waits for it until the
        collective timeout. Nothing is printed.

    Evidence
        rank, the waiting frame, the frames of the main thread, the other threads blocked on
        locks with their frames, phase.

    Fix
        Take the locks in one global order in every thread, hold none across a collective or a
        blocking queue call, and use timeouts (``lock.acquire(timeout=...)``) so that a deadlock
        surfaces as an error.

    References
        py-spy dump; pystack.
    """

    code = "SD104"
    name = "python-deadlock"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, stacks in sorted(window.stacks.items()):
            if rank in window.finished:   # its script returned: SD119 says what holds it
                continue
            main = stacks.main
            where = waits_on_lock(main) if main else None
            if main is None or where is None:
                continue
            others = [(t, f) for t in stacks.threads if t is not main
                      for f in [waits_on_lock(t)] if f is not None]
            holders = "; ".join(f"thread {t.name or t.thread_id} waits at {f}" for t, f in others)
            summary = f"rank {rank}: main thread waits on a lock at {where}"
            summary += f"; {holders} (lock-order deadlock)" if others else "; holder not visible"
            yield self.finding((rank,), summary, {
                "frames": frame_strings(main), "frame": str(where), "phase": phase_of(window, rank),
                "seconds_without_progress": stuck_for(window, rank),
                "blocked_threads": [{"thread": t.name or t.thread_id, "frame": str(f),
                                     "frames": frame_strings(t)} for t, f in others]})
