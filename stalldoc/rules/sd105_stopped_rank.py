"""SD105 stopped-rank."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, rank_evidence


class StoppedRank(Rule):
    """A rank's process is stopped (SIGSTOP, SIGTSTP, or a debugger holding it).

    What it does
        Reads the process state of every rank; a rank in state "stopped" at the stall is named.

    Why is this bad?
        A stopped process runs no code at all: its peers wait for it in their next collective
        until the timeout. It often comes from Ctrl-Z in a terminal, a `kill -STOP`, or a
        debugger left attached.

    Evidence
        rank, pid, process state, frames read without stopping it (py-spy --nonblocking).

    Fix
        Resume it with ``kill -CONT <pid>`` and find who stopped it: job control (Ctrl-Z), a
        debugger, or a cluster agent sending SIGSTOP.

    References
        proc(5) process states.
    """

    code = "SD105"
    name = "stopped-rank"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        stopped = sorted(rank for rank, samples in window.host.items()
                         if samples and samples[-1].status in ("stopped", "tracing-stop"))
        if not stopped:
            return
        pids = {r: window.host[r][-1].pid for r in stopped}
        summary = f"{join_ranks(stopped)} stopped (pid {', '.join(str(p) for p in pids.values())})"
        yield self.finding(stopped, summary, {**rank_evidence(window, stopped[0]),
                                              "pids": {str(r): p for r, p in pids.items()}},
                           f"Resume with `kill -CONT {' '.join(str(p) for p in pids.values())}` and "
                           "find who stopped it (Ctrl-Z, a debugger, SIGSTOP).")
