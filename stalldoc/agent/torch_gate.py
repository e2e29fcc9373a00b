"""The one door through which the agent's heartbeat thread calls into torch's C++.

Why a door: the heartbeat is a daemon thread. When the interpreter finalizes, a daemon thread
that wants the GIL back is ended with ``pthread_exit``; if it is then inside a pybind11 call that
released the GIL (``ProcessGroup._get_sequence_number_for_group()``, a CUDA event query, a Flight
Recorder dump), the forced unwind meets a ``noexcept`` destructor and the C++ runtime aborts the
process: ``terminate called without an active exception``, SIGABRT, exit code 134 for a job that
had finished. A loop of such reads on a daemon thread of a gloo process aborts it on 20 exits out
of 20 (torch 2.13); behind this door, 0 out of 30.

The door: the heartbeat holds a lock for each torch call, and an ``atexit`` handler, registered
at the first call (so after torch's own import-time handlers, and run before them), takes that
lock and shuts the door for good. Finalization happens after every atexit handler, so no
heartbeat call into torch is running or can start by then. The handler waits at most
``CLOSE_WAIT`` seconds for a call in progress: the job's exit is never held longer.
Standard library only.
"""
from __future__ import annotations

import atexit

from stalldoc.agent import primitives

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

CLOSE_WAIT = 1.0   # seconds the job's exit may wait for a heartbeat call into torch to return


class TorchGate:
    """Runs the heartbeat's calls into torch while the interpreter is not finalizing."""

    def __init__(self) -> None:
        self._lock = primitives.allocate_lock()
        self.closed = False
        self._registered = False

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` unless the door is shut (then None); exceptions pass through."""
        with self._lock:
            if self.closed:
                return None
            if not self._registered:
                atexit.register(self.close)
                self._registered = True
            return fn(*args)

    def close(self) -> None:
        """Shut the door: wait (bounded) for a call in progress, then refuse every later one."""
        held = self._lock.acquire(timeout=CLOSE_WAIT)
        self.closed = True
        if held:
            self._lock.release()

    def forget_after_fork(self) -> None:
        """In a forked child: no heartbeat runs here, and the lock may have been copied held."""
        self._lock = primitives.allocate_lock()
        self.closed = True
