"""How a scenario job leaves once its work is done, clear of torch 2.13's own exit race.

The race (pytorch/pytorch issue 190489; PR 179291 tried an atexit fix and was abandoned): a gloo
worker thread that frees its last work object, or otherwise takes the GIL, while the interpreter
finalizes is ended through a ``noexcept`` frame, and a rank that had finished its work dies with
``terminate called without an active exception`` (SIGABRT). Seen here about 1 run in 15 of a
2-rank gloo DDP job without stalldoc, more under load. Dropping the DDP model and collecting it
before ``destroy_process_group()`` does not help on 2.13: building a DDP model keeps references
to the process group that freeing the model does not release, so the group's gloo threads live on
to finalization whatever the script frees.

A scenario whose subject is not its exit calls ``leave()`` as its last line: once its output is
flushed it ends without finalizing the interpreter (``os._exit``), the way around the race that
SD115 gives users. ``EXIT_RACE=keep`` returns instead, so the script ends as most scripts do,
race and all: ``benchmarks/exit_aborts.py`` measures how often it fires that way, plain and under
``stalldoc watch``."""
import os
import sys


def leave(code: int = 0) -> None:
    """End now with ``code``, output flushed, the interpreter not finalized; with
    ``EXIT_RACE=keep`` return, to end the ordinary way."""
    if os.environ.get("EXIT_RACE") == "keep":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
