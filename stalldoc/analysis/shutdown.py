"""What holds a process whose script has returned (its agent said so): Python, at its end, first
waits for the threads that are not daemons (``threading._shutdown``), then runs the ``atexit``
handlers; either may never return. Read from the main thread's stack: in ``_shutdown``, the
threads still running are the candidates (a stack cannot tell a daemon thread from one that is
not: a single candidate is the holder, several are listed as they are); otherwise the main
thread's frames are an exit handler's, called by the interpreter with nothing of the script
below it."""
from __future__ import annotations

import os
from dataclasses import dataclass

from stalldoc.analysis.stacks import frame_strings, user_frame
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack, os_main_thread, runs_agent

THREADS, EXIT_HANDLER, UNSEEN = "threads", "exit handler", "unseen"


@dataclass(frozen=True)
class Holder:
    """A thread still running at the end, or the exit handler, and where it is."""

    thread: str
    frame: Frame | None
    frames: tuple[str, ...]


@dataclass(frozen=True)
class Held:
    """Why a finished process does not end: ``kind`` (``threads``, ``exit handler``, or
    ``unseen`` where its stacks were not read) and what holds it."""

    kind: str
    holders: tuple[Holder, ...] = ()


def held(stacks: RankStacks | None) -> Held:
    """What holds the finished process whose stacks these are (its own main thread tells,
    whatever thread runs its work)."""
    main = os_main_thread(stacks.pid, stacks.threads) if stacks is not None else None
    if stacks is None or main is None or not main.frames:
        return Held(UNSEEN)
    outer = main.frames[-1]
    if outer.name == "_shutdown" and os.path.basename(outer.filename) == "threading.py":
        running = [t for t in stacks.threads if t is not main and t.frames
                   and not runs_agent(t)]
        return Held(THREADS, tuple(_holder(t) for t in running))
    return Held(EXIT_HANDLER, (_holder(main),))


def _holder(thread: ThreadStack) -> Holder:
    return Holder(thread.name or str(thread.thread_id), user_frame(thread),
                  tuple(frame_strings(thread)))
