"""stalldoc agent bootstrap: start the agent, then run the sitecustomize this file shadows."""
import os
import sys


def _stalldoc_start() -> None:
    try:
        from stalldoc.agent import runtime
        runtime.start_from_env()
    except Exception as exc:  # noqa: BLE001 - the job must run on whatever happens here
        sys.stderr.write(f"stalldoc: agent not started: {exc!r}\n")


def _stalldoc_chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401 - the user's own, if there is one
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        sys.modules["sitecustomize"] = ours  # the import system expects its own module back


_stalldoc_start()
_stalldoc_chain()
