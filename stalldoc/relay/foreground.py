"""The terminal's foreground, handed to the job as a shell would: Ctrl-C, Ctrl-\\ and Ctrl-Z
reach the job's process group directly, the job can read the terminal, and when the job stops
(Ctrl-Z) the relay takes the terminal back and stops too, so the shell gets its prompt."""
from __future__ import annotations

import os
import signal


class Foreground:
    def __init__(self) -> None:
        self.tty = _our_terminal()
        self.job_pgid: int | None = None

    def give(self, pgid: int) -> None:
        """Make ``pgid`` the terminal's foreground group (only where we held the foreground)."""
        self.job_pgid = pgid
        self._set(pgid)

    def take_back(self) -> None:
        self._set(os.getpgrp())

    def stop_with_job(self) -> None:
        """The job stopped: take the terminal back and stop until the shell continues us."""
        self.take_back()
        os.kill(os.getpid(), signal.SIGSTOP)

    def resumed(self) -> None:
        if self.job_pgid is not None:
            self._set(self.job_pgid)

    def _set(self, pgid: int) -> None:
        if self.tty is None:
            return
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(self.tty, pgid)
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, previous)


def _our_terminal() -> int | None:
    """Our stdin's terminal, if we are in its foreground (else the shell ran us in the
    background, or there is no terminal: nothing to hand over)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None
