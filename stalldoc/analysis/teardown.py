"""Whether a rank that ended badly had finished its work: it died in its own teardown.

The agent says where a rank is in its life (``agent/runtime.py``): running, inside the job's
``destroy_process_group()`` of every group (``STATUS_TEARDOWN``), past it (``STATUS_LEFT``: the
rank left its world), or past the job's code with every atexit handler run (``STATUS_EXITED``:
the interpreter finalizes). A rank that ended by a signal there, with no uncaught exception and
no collective left unfinished in its rings, had done its training: what killed it was the
teardown (torch's, a C extension's, or the launcher ending it then), not the work. So had one
that left its world and then ended with a non-zero status without running Python's exit
handlers (``os._exit``, a C ``_exit``): Ray ends its workers that way when their driver shuts
down. A status chosen with ``sys.exit(N)`` runs them (``STATUS_EXITED``) and stays a failure."""
from __future__ import annotations

from dataclasses import dataclass

from stalldoc.agent.statefile import STATUS_EXITED, STATUS_LEFT, STATUS_TEARDOWN
from stalldoc.model.ranks import RankExit
from stalldoc.model.window import Window

WHERE = {STATUS_EXITED: "interpreter exit", STATUS_TEARDOWN: "destroy_process_group",
         STATUS_LEFT: "after destroy_process_group"}


@dataclass(frozen=True)
class Teardown:
    """A rank that ended by a signal, or with a status after leaving its world, after its
    work was done."""

    exit: RankExit
    where: str                  # "interpreter exit", "destroy_process_group" or "after
                                # destroy_process_group"
    phases_completed: int
    collectives_completed: int
    c10d_issued: int            # collectives issued on its process groups (DDP's included)
    phase_stack: tuple[str, ...]


def after_work(window: Window, exit: RankExit) -> Teardown | None:
    """The teardown ``exit`` ended in, or None: no agent of that very process, an uncaught
    exception, a collective unfinished, not yet past its work, or a status (no signal) other
    than after leaving its world."""
    agent = window.agents.get(exit.rank)
    if agent is None or agent.pid != exit.pid:
        return None
    where = WHERE.get(agent.status)
    if where is None or agent.error or agent.pending:
        return None
    if not exit.signal and agent.status != STATUS_LEFT:
        return None
    return Teardown(exit, where, agent.phases_completed, agent.collective_seq, agent.c10d_issued,
                    agent.phase_stack)


def teardowns(window: Window) -> list[Teardown]:
    """The ranks that ended by a signal after their work, oldest first, when the first rank to
    end badly is one of them (else the training failed first: none)."""
    bad = sorted((e for e in window.exits if e.exit_code not in (0, None)), key=lambda e: e.t)
    if not bad or after_work(window, bad[0]) is None:
        return []
    return [t for t in (after_work(window, e) for e in bad) if t is not None]
