"""SD103 dead-rank."""
from __future__ import annotations

import signal
from typing import Iterator

from stalldoc.analysis.teardown import teardowns
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankExit
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, phase_of, phase_stack_of, signal_name
from stalldoc.rules.sd529_collective_mismatch_reported import CollectiveMismatchReported

_OOM_HINT = ("SIGKILL with no one asking for it is usually the kernel OOM killer: check "
             "`dmesg | grep -i 'killed process'` and the host memory below; lower the host "
             "memory the rank needs (CPU offload, dataloader workers, pinned memory) or add memory.")


_MISMATCH_FIX = ("Not a crash of its own: the backend ended the rank because the ranks' "
                 "collectives did not match (the mismatch line in the log; SD529 has its sizes "
                 "and ops). Make every rank call the same collectives, in the same order, with "
                 "tensors of the same shape: pad per-rank data to a common length or use "
                 "all_gather_object; move a collective out of a branch some ranks skip.")

_UNKNOWN_FIX = ("Nothing says it failed: the launcher did not report an error for it. If the job "
               "went wrong, read the rank's own log.")


def _interrupted(window: Window, dead: RankExit) -> bool:
    """The rank ended on the user's interrupt: killed by SIGINT, or its agent saw it raise
    KeyboardInterrupt (a launcher's worker exits 1 with it)."""
    agent = window.agents.get(dead.rank)
    return dead.signal == signal.SIGINT or bool(
        agent is not None and agent.error.startswith("KeyboardInterrupt"))


class DeadRank(Rule):
    """A rank ended (by a signal or a non-zero exit) while the others ran on or hung.

    What it does
        Watches every rank's process; when one ends abnormally before the job does, blames it by
        name with its exit code or signal, the phase it was in, and the exception it raised when
        the agent saw one. The first rank to die is the cause; ranks the launcher ended after it
        are collateral and listed as such. A rank that exits 0 is never blamed, nor one the user
        interrupted: the first to end killed by SIGINT or raising KeyboardInterrupt (Ctrl-C at a
        terminal reaches the job's process group directly), or any while the interrupt
        stalldoc passed on settles. A status nobody
        saw (the launcher reaped the rank first) is taken from the launcher's report in the log,
        from the agent (an uncaught exception), or is 0 once the launcher exits 0; otherwise it
        is reported as unknown, at info level. When the first rank to end badly had finished
        its work (killed at interpreter exit or inside ``destroy_process_group``), SD115 says
        so instead.

    Why is this bad?
        The survivors wait in their next collective for a peer that will never come, until the
        collective timeout, or the launcher tears the whole job down with an error that names
        the wrong rank.

    Evidence
        rank, pid, exit code, signal, phase, exception text, seconds before the other ranks
        ended, the rank's last RSS and the host's available memory (for SIGKILL).

    Fix
        Read the rank's own log for its last error, and the evidence for its exit status: SIGKILL is
        usually the OOM killer (see the host memory figures), SIGSEGV / SIGABRT a native crash
        (NCCL, CUDA, a C extension), a non-zero exit an exception in its log.

        Where the job's log says the ranks' collectives did not match (gloo's size check aborts
        the rank with SIGABRT; PyTorch's checker raises), the fix is that mismatch's (SD529), not
        a crash's; the evidence quotes the line.

    References
        torchrun ChildFailedError "Root Cause (first observed failure)".
    """

    code = "SD103"
    name = "dead-rank"
    severity = Severity.CRITICAL
    trigger = "exit"

    def check(self, window: Window) -> Iterator[Finding]:
        bad = sorted((e for e in window.exits if e.exit_code not in (0, None)), key=lambda e: e.t)
        if bad and teardowns(window):
            return   # the first rank to end badly had done its work: SD115 says so
        if bad and _interrupted(window, bad[0]):
            return   # Ctrl-C at a terminal reaches the job's ranks directly: the user's end
        if bad:
            first = bad[0]
            fix, cause = self._fix(window, first)
            yield self.finding((first.rank,), self._summary(window, first, bad[1:]),
                               {**self._evidence(window, first, bad[1:]), **cause}, fix)
            return
        unknown = sorted((e for e in window.exits if e.exit_code is None), key=lambda e: e.t)
        if unknown:   # a rank that exits 0 is never critical; one nobody saw end is not either
            yield self.finding([e.rank for e in unknown], self._unknown(window, unknown),
                               self._evidence(window, unknown[0], unknown[1:]),
                               _UNKNOWN_FIX, Severity.INFO)

    def _unknown(self, window: Window, exits: list[RankExit]) -> str:
        first = exits[0]
        text = (f"{join_ranks(e.rank for e in exits)} ended and the exit status was not seen "
                f"(the launcher reaped rank {first.rank}, pid {first.pid}, first and did not "
                f"report it)")
        phase = phase_of(window, first.rank)
        return text + (f"; rank {first.rank} was in phase {phase}" if phase else "")

    def _summary(self, window: Window, dead: RankExit, collateral: list[RankExit]) -> str:
        how = (f"was killed by {signal_name(dead.signal)}" if dead.signal
               else f"exited with status {dead.exit_code}" if dead.exit_code is not None
               else "ended (exit status not seen)")
        text = f"rank {dead.rank} (pid {dead.pid}) {how}"
        phase = phase_of(window, dead.rank)
        if phase:
            text += f" in phase {phase}"
        agent = window.agents.get(dead.rank)
        if agent and agent.error:
            text += f": {agent.error}"
        if collateral:
            text += f"; ranks {','.join(str(e.rank) for e in collateral)} ended after it"
        early = sorted((e for e in window.exits if e.exit_code == 0 and e.t < dead.t),
                       key=lambda e: e.t)
        if early:   # a rank that left first makes the others' next collective fail
            text += (f"; {join_ranks(e.rank for e in early)} had exited 0 "
                     f"{dead.t - early[0].t:.0f} s before it, while the others still ran: if "
                     f"they failed in a collective, the rank that left early is the cause "
                     f"(uneven inputs)")
        return text

    def _evidence(self, window: Window, dead: RankExit, collateral: list[RankExit]) -> dict:
        # the living process's samples: a zombie (killed, not yet reaped) holds no memory, nor
        # does a process in its exit that has released its memory and is no zombie yet (a
        # living process's RSS is never 0: its code is mapped)
        samples = [s for s in window.host.get(dead.rank, ())
                   if s.status != "zombie" and s.rss_bytes > 0]
        agent = window.agents.get(dead.rank)
        evidence = {"frames": [], "phase": phase_of(window, dead.rank),
                    "phase_stack": phase_stack_of(window, dead.rank), "pid": dead.pid,
                    "exit_code": dead.exit_code, "signal": dead.signal,
                    "exit_source": dead.source, "exception": agent.error if agent else "",
                    "collateral_ranks": [e.rank for e in collateral]}
        if samples:
            evidence["last_rss_bytes"] = samples[-1].rss_bytes
            evidence["rss_bytes_first_last"] = [samples[0].rss_bytes, samples[-1].rss_bytes]
            evidence["host_available_bytes_min"] = min(s.host_available_bytes for s in samples)
        return evidence

    def _fix(self, window: Window, dead: RankExit) -> tuple[str, dict[str, str]]:
        """The fix for how the rank ended, and the evidence of its cause where the log has it
        (a collective mismatch the backend reported)."""
        if dead.signal == signal.SIGKILL:
            return _OOM_HINT, {}
        mismatch = _mismatch_line(window)
        if mismatch:
            return _MISMATCH_FIX, {"mismatch_line": mismatch}
        if dead.signal in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            return ("A native crash: run the rank with PYTHONFAULTHANDLER=1 and check NCCL / CUDA / "
                    "C extension versions; NCCL_DEBUG=INFO shows communicator errors."), {}
        return self.fix, {}


def _mismatch_line(window: Window) -> str:
    """The last line of the job's log that reports a collective mismatch, by SD529's own
    compiled patterns, or ''. The tail holds the newest lines; unread lines it no longer holds
    (a burst since the last tick) are older than all of it, so they come first."""
    program = CollectiveMismatchReported.program()
    lines = [*(line.text for line in window.log), *window.log_tail]
    return next((line.strip()[:500] for line in reversed(lines)
                 if any(needle in line and p.search(line) for needle, p in program)), "")
