"""SD115 teardown-crash."""
from __future__ import annotations

import signal
from typing import Iterator

from stalldoc.agent.statefile import STATUS_LEFT, STATUS_TEARDOWN
from stalldoc.analysis.teardown import WHERE, Teardown, teardowns
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankExit
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, signal_name

UPSTREAM = "pytorch/pytorch issue 190489"
_ABORT_FIX = ("The training steps had completed. The abort is torch's own exit race (gloo or "
              "autograd threads that take the GIL while Python finalizes; "
              f"{UPSTREAM}), and it makes the job's exit status non-zero. A gloo thread can only "
              "do that while its process group lives at exit: on torch 2.13 groups outlive "
              "`destroy_process_group()` whenever `torch._dynamo` was first imported after "
              "`init_process_group()` (`optimizer.step()` and DDP import it on first use). "
              "Either `import torch._dynamo` before `init_process_group()` and free DDP models "
              "before `destroy_process_group()`, so the threads end while Python is alive; or, "
              "once `destroy_process_group()` has returned and everything is saved and flushed "
              "(checkpoints, `wandb.finish()`, `logging.shutdown()`), end the rank with "
              "`os._exit(0)`.")
_DESTROY_NOTE = (" It crashed inside `destroy_process_group()`: check that what the script does "
                 "after it (a final save) ran.")
_AFTER_NOTE = (" It died after `destroy_process_group()` had returned: check that what the "
               "script does after it (a final save) ran.")
_LEFT_FIX = ("The rank had left its process group (`destroy_process_group()` returned) with its "
             "work done, then ended with this status without running Python's exit handlers "
             "(`os._exit`, a C-level `_exit`): Ray ends its workers that way when their driver "
             "shuts down, and a launcher may end a rank so. Nothing of the training failed; if "
             "the job's own exit status is 0, nothing failed at all. A status the script means "
             "to report goes through `sys.exit(N)`, which runs the exit handlers and is then a "
             "dead rank (SD103).")


class TeardownCrash(Rule):
    """A rank was killed by a signal after its work was done: in torch's teardown, not training.

    What it does
        When the first rank to end badly had finished its Python code (every atexit handler
        run, the interpreter finalizing) or was inside the job's ``destroy_process_group()``,
        with no uncaught exception and no collective left unfinished, says that, at warning
        level, instead of a dead rank (SD103): which ranks, the signal, where in the teardown,
        the phases and collectives they had completed, and the ranks ended after it. For
        SIGABRT it names torch's known exit race. So for a rank that had left its process group
        (``destroy_process_group()`` returned) and then ended with a non-zero status without
        Python's exit handlers (``os._exit``): a Ray worker ended as its driver shuts down.
        The job's exit status is left as it is. A rank that chose to leave with
        ``sys.exit(N)`` and then crashed at exit looks the same: the status N it meant is lost
        to the signal, and nothing in the process keeps it.

    Why is this bad?
        The training finished, but the job's exit status says it failed (torchrun reports the
        signal and exits 1): a scheduler or pipeline that trusts it retries or discards a good
        run. The signal hides nothing of the training itself, and no stall follows.

    Evidence
        per rank: pid, signal, ``where`` (``interpreter exit`` or ``destroy_process_group``),
        phases and collectives completed (``c10d_issued``: DDP's included), the phase stack left;
        the ranks ended after the first; for SIGABRT the upstream issue.

    Fix
        The training steps had completed. SIGABRT ("terminate called without an active
        exception") is torch's own exit race: ``import torch._dynamo`` before
        ``init_process_group()`` and free DDP models before ``destroy_process_group()``, or end
        with ``os._exit(0)`` once outputs are flushed. Crashed in ``destroy_process_group``:
        check that what follows it ran. Other signals came from outside (launcher, OOM killer).

        A gloo thread can only race while its process group lives at exit. On torch 2.13
        ``torch._dynamo``, imported on first use by ``optimizer.step()`` and DDP, keeps every
        group that exists at its import alive for good, so ``destroy_process_group()`` cannot
        end their threads; imported first, it holds none.

    References
        pytorch/pytorch issue 190489 (threads that take the GIL while Python finalizes abort
        the process: ``AsyncAllgatherWork`` on a gloo thread, ``GraphTask`` on an autograd
        worker); PR 179291 ("Register atexit handler to destroy process groups before
        interpreter finalization", abandoned); issue 28126 (``terminate called without an
        active exception`` from a thread not joined: torch.distributed.rpc's ProcessGroupAgent,
        the same abort at a process's end).
    """

    code = "SD115"
    name = "teardown-crash"
    severity = Severity.WARNING
    trigger = "exit"

    def check(self, window: Window) -> Iterator[Finding]:
        done = teardowns(window)
        if not done:
            return
        first = done[0]
        crashed = [t for t in done if t.exit.signal == first.exit.signal]
        ranks = {t.exit.rank for t in crashed}
        after = sorted((e for e in window.exits if e.t >= first.exit.t and e.rank not in ranks
                        and e.exit_code != 0), key=lambda e: e.t)
        aborted = first.exit.signal == signal.SIGABRT
        fix = (_ABORT_FIX if aborted else _LEFT_FIX if not first.exit.signal else self.fix) + (
            _DESTROY_NOTE if aborted and first.where == WHERE[STATUS_TEARDOWN] else
            _AFTER_NOTE if first.exit.signal and first.where == WHERE[STATUS_LEFT] else "")
        yield self.finding(sorted(ranks), self._summary(crashed, after, done, aborted),
                           self._evidence(crashed, after, done, aborted), fix)

    @staticmethod
    def _summary(crashed: list[Teardown], after: list[RankExit], done: list[Teardown],
                 aborted: bool) -> str:
        first = crashed[0]
        work = (f"{first.phases_completed} phases and " if first.phases_completed else "")
        work += f"{max(first.collectives_completed, first.c10d_issued)} collectives"
        text = (f"{join_ranks(t.exit.rank for t in crashed)} {_how(first.exit, first.where)}, "
                f"after the work was done (rank {first.exit.rank}, pid {first.exit.pid}: {work} "
                "behind it, none pending)")
        if aborted:
            text += f": torch's own exit race ({UPSTREAM}), not a training failure"
        where = {t.exit.rank: t.where for t in done}
        for exit in after:
            text += (f"; rank {exit.rank} ended after it ({signal_name(exit.signal)}"
                     if exit.signal else f"; rank {exit.rank} ended after it (status "
                     f"{exit.exit_code}") + (f", {_at(where[exit.rank])})" if exit.rank in where
                                            else ")")
        return text + "; the job's exit status is the launcher's answer to it"

    @staticmethod
    def _evidence(crashed: list[Teardown], after: list[RankExit], done: list[Teardown],
                  aborted: bool) -> dict:
        where = {t.exit.rank: t.where for t in done}
        return {"frames": [], "where": crashed[0].where,
                "upstream": UPSTREAM if aborted else "",
                "ranks": {str(t.exit.rank): {
                    "pid": t.exit.pid, "signal": t.exit.signal, "exit_code": t.exit.exit_code,
                    "where": t.where, "phases_completed": t.phases_completed,
                    "collectives_completed": t.collectives_completed,
                    "c10d_issued": t.c10d_issued, "phase_stack": list(t.phase_stack),
                    "exit_source": t.exit.source} for t in crashed},
                "ended_after": [e.rank for e in after],
                "ended_after_detail": {str(e.rank): {
                    "pid": e.pid, "signal": e.signal, "exit_code": e.exit_code,
                    "where": where.get(e.rank, "")} for e in after}}


def _at(where: str) -> str:
    """'at interpreter exit', 'after destroy_process_group'."""
    return where if where.startswith("after ") else f"at {where}"


def _how(exit: RankExit, where: str) -> str:
    """'killed by SIGABRT at interpreter exit', 'exited with status 1 after
    destroy_process_group'."""
    how = (f"killed by {signal_name(exit.signal)}" if exit.signal
           else f"exited with status {exit.exit_code}")
    return f"{how} {_at(where)}"
