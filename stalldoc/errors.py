"""Errors stalldoc reports to the user as one line, each with its documented exit code."""
from __future__ import annotations

import os
import traceback
from pathlib import Path

from stalldoc.redact import redact_text

EXIT_STALL_KILLED = 124   # --on-stall kill ended the job after a stall was diagnosed
EXIT_STALLDOC_FAILED = 125  # stalldoc could not start watching; the job was not launched
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_BAD_RUN_DIR = 1      # report: the run directory cannot be read
# what would break a message's one line (a path or value given by the user may hold any of
# them): C0 controls but the tab, DEL, and the characters str.splitlines() breaks at
_LINE_BREAKERS = {c: f"\\x{c:02x}" for c in (*range(0, 9), *range(10, 32), 0x7F, 0x85)}
_LINE_BREAKERS.update({0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(text: str) -> str:
    """``text`` with every line break and control character written as its escape."""
    return text.translate(_LINE_BREAKERS)


class StalldocError(Exception):
    """An error with a one-line message and the exit code the CLI returns for it."""

    exit_code = EXIT_STALLDOC_FAILED

    def __init__(self, message: str) -> None:
        message = one_line(message)   # the user's own paths and values included
        super().__init__(message)
        self.message = message


class CommandNotFound(StalldocError):
    exit_code = EXIT_NOT_FOUND

    def __init__(self, command: str) -> None:
        super().__init__(f"command not found: {command}")


class CommandNotExecutable(StalldocError):
    exit_code = EXIT_NOT_EXECUTABLE

    def __init__(self, command: str) -> None:
        super().__init__(f"command not executable: {command}")


class RunDirError(StalldocError):
    """A run directory that cannot be created, or read back."""

    exit_code = EXIT_BAD_RUN_DIR


class PtraceDenied(StalldocError):
    """py-spy could not attach to a rank."""

    HELP_TEXT = (
        "py-spy needs ptrace permission to read a rank's stack. Run stalldoc as the same user as "
        "the job and either as root, with CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE), or "
        "with /proc/sys/kernel/yama/ptrace_scope set to 0 or 1 (the agent allows its watcher under "
        "scope 1). Until then stalldoc falls back to a faulthandler dump (Python frames only)."
    )


def log_traceback(path: Path) -> str:
    """Append the exception being handled to ``path`` (best effort; created mode 0600, never
    through a link); its last line, to say. Redacted: an exception's message may quote the job's
    output or its command line."""
    text = redact_text(traceback.format_exc())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with open(fd, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        pass
    return text.strip().splitlines()[-1]
