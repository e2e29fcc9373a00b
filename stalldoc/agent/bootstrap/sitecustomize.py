"""stalldoc agent bootstrap: start the agent, then run the sitecustomize this file shadows."""
import os
import sys
import time

_STALLDOC_T0 = time.perf_counter()


def _stalldoc_start() -> None:
    try:
        from stalldoc.agent import start
        start.start_from_env(_STALLDOC_T0)
    except Exception:  # noqa: BLE001 - the job must run on whatever happens here, untouched
        pass


def _stalldoc_chain() -> None:
    """Import the user's own sitecustomize, if any, as if ours were not there: our directory is
    off sys.path while it runs, and what it did to sys.path is kept (ours goes back where it
    was)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours_at = [i for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == here]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    module = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401 - the user's own, if there is one
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        for index in ours_at:
            sys.path.insert(min(index, len(sys.path)), here)
        sys.modules["sitecustomize"] = module  # the import system expects its own module back


_stalldoc_start()
_stalldoc_chain()
