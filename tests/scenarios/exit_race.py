"""How a scenario job leaves once its work is done, clear of torch 2.13's own exit race.

The race (pytorch/pytorch issue 190489; PR 179291 tried an atexit fix and was abandoned): a gloo
worker thread that frees its last work object, or otherwise takes the GIL, while the interpreter
finalizes is ended through a ``noexcept`` frame, and a rank that had finished its work dies with
``terminate called without an active exception`` (SIGABRT). Seen here in about 1 run in 15 of
a 2-rank gloo DDP job without stalldoc. It needs the group's threads alive at exit, and on 2.13
they are in most training scripts: ``torch._dynamo``, imported on first use by
``optimizer.step()`` and by DDP, keeps every process group that exists at its import alive for
good, so ``destroy_process_group()`` cannot end their threads (``ddp_group_threads.py``).

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
