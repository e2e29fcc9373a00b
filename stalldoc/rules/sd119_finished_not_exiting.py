"""SD119 finished-not-exiting."""
from __future__ import annotations

from typing import Any, Iterator

from stalldoc.agent.statefile import STATUS_EXCEPTION
from stalldoc.analysis.shutdown import EXIT_HANDLER, THREADS, Held, held
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule

_THREADS_FIX = ("A thread that is not a daemon keeps the process alive after the script "
                "returns, until it ends. Start helper threads with `daemon=True` (a metrics or "
                "upload loop, a watchdog), or end them before the script returns: put a "
                "sentinel on the queue they read and `join(timeout=...)` them. For a tracker "
                "(`wandb.finish()`, `mlflow.end_run()`, `SummaryWriter.close()`), call its "
                "finish on the ranks that started it before the end of the script, where a "
                "stall is seen as one.")
_HANDLER_FIX = ("An exit handler (`atexit.register`, a library's finalizer) blocks: give the "
                "call it makes a timeout (an upload, a final sync, a remote store), or do that "
                "work at the end of the script instead, where it can fail loudly.")
_UNSEEN_FIX = ("Take the rank's stack (`py-spy dump --pid PID`): its main thread shows the "
               "exit handler, or `threading._shutdown` waiting for a thread that is not a daemon.")


class FinishedNotExiting(Rule):
    """A rank finished its script but its process does not end: what holds it.

    What it does
        At a stall, for each rank whose agent said its script returned (Python's own exit
        call, made before it waits for the threads and runs the exit handlers), reads its main
        thread's stack: in ``threading._shutdown``, Python waits for the threads that are not
        daemons, and the threads still running are named (one: the holder; several: each, as
        a stack cannot tell a daemon thread from one that is not); otherwise an exit handler
        runs (``atexit``, a finalizer), and its frame is named. A warning: the work is done.
        The other stall rules keep away from such a rank (its lock wait is no deadlock).

    Why is this bad?
        The training finished and its checkpoints were written, but the process holds its GPUs
        and its node until a scheduler's time limit ends it, hours later (Megatron users, jobs
        whose logger or uploader thread never ends), and a pipeline waiting for its exit
        status waits too. Without its agent's word it reads as a rank waiting on a lock.

    Evidence
        ``finished_at`` (when the script returned), ``held_by`` (``threads``, ``exit handler``,
        ``unseen``), ``holders`` (each thread's name, frame and frames), whether the script
        ended with an exception.

    Fix
        A thread: make it a daemon, or end and join it before the script returns; a tracker's
        ``finish()`` before the end. An exit handler: a timeout on what it waits for, or that
        work done before the end. ``--on-stall kill`` ends such a job as any stall (the work
        was done; the node comes back).

    References
        NVIDIA-NeMo/Megatron-Bridge#1656 and NVIDIA-NeMo/Megatron-Bridge#3427 ("[after
        training is done]", then the step cancelled for its time limit), microsoft/unilm#1250
        ("done training", the process never exits), wandb/wandb#919 (wandb's process at the end
        of a Slurm job), facebookincubator/submitit#1643 (multi-node jobs run until their
        timeout when done), PrimeIntellect-ai/prime-rl#3573 (an orchestrator's final drain held
        the nodes for hours after the trainer finished); Python's
        ``threading._register_atexit`` (the call made when the script returns).
    """

    code = "SD119"
    name = "finished-not-exiting"
    severity = Severity.WARNING
    trigger = "stall"

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, finished_at in sorted(window.finished.items()):
            why = held(window.stacks.get(rank))
            agent = window.agents.get(rank)
            failed = agent is not None and agent.status == STATUS_EXCEPTION
            summary = (f"rank {rank} finished its script {window.now - finished_at:.0f} s ago"
                       f"{' (with an exception)' if failed else ''} but does not exit: "
                       f"{_holding(why)}")
            yield self.finding((rank,), summary, _evidence(why, finished_at, failed),
                               _fix(why))


def _holding(why: Held) -> str:
    if why.kind == THREADS and len(why.holders) == 1:
        [one] = why.holders
        return f"Python waits for its thread '{one.thread}', not a daemon, at {one.frame}"
    if why.kind == THREADS and why.holders:
        each = "; ".join(f"'{h.thread}' at {h.frame}" for h in why.holders)
        return f"Python waits for its threads that are not daemons, among: {each}"
    if why.kind == THREADS:
        return "Python waits for a thread that is not a daemon, whose stack was not read"
    if why.kind == EXIT_HANDLER:
        [handler] = why.holders
        return f"an exit handler blocks at {handler.frame}"
    return "its stack was not read to tell what holds it"


def _evidence(why: Held, finished_at: float, failed: bool) -> dict[str, Any]:
    return {"finished_at": finished_at, "held_by": why.kind, "exception": failed,
            "holders": [{"thread": h.thread, "frame": str(h.frame) if h.frame else "",
                         "frames": list(h.frames)} for h in why.holders]}


def _fix(why: Held) -> str:
    return {THREADS: _THREADS_FIX, EXIT_HANDLER: _HANDLER_FIX}.get(why.kind, _UNSEEN_FIX)
