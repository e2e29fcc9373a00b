"""The job's stdout and stderr: a pseudo-terminal where ours is a terminal (so the job's
``isatty``, its line buffering, colours and progress bars are as without stalldoc), a pipe
otherwise. The relay reads the other end and writes every byte on to ours."""
from __future__ import annotations

import fcntl
import os
import pty
import termios
from dataclasses import dataclass

_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20   # slack for the job while the relay writes to a slow terminal


@dataclass
class Stream:
    """One output stream of the job: ``read_fd`` is ours, ``job_fd`` goes to the job."""

    name: str            # stdout / stderr
    target: int          # where the bytes go (our fd 1 or 2)
    read_fd: int
    job_fd: int
    is_pty: bool

    def close_job_end(self) -> None:
        os.close(self.job_fd)
        self.job_fd = -1

    def sync_size(self) -> None:
        """Give the pseudo-terminal the window size of ours (on start and on SIGWINCH)."""
        if not self.is_pty:
            return
        try:
            size = fcntl.ioctl(self.target, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.job_fd if self.job_fd >= 0 else self.read_fd,
                        termios.TIOCSWINSZ, size)
        except OSError:
            pass


def open_stream(name: str, target: int) -> Stream:
    """A pseudo-terminal like ``target`` when it is a terminal, else a large pipe."""
    if _isatty(target):
        try:
            return _pty_stream(name, target)
        except OSError:
            pass
    read_fd, job_fd = os.pipe()
    try:
        fcntl.fcntl(read_fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass
    return Stream(name, target, read_fd, job_fd, False)


def _pty_stream(name: str, target: int) -> Stream:
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(target)
    attrs[1] &= ~termios.OPOST   # bytes pass unchanged; our terminal does its own output mapping
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    stream = Stream(name, target, master, slave, True)
    stream.sync_size()
    return stream


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
