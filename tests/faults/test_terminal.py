"""Under a real pseudo-terminal, a watched job sees its terminal as it would without stalldoc:
isatty on 0/1/2, /dev/tty opens, a line typed at the terminal reaches it, the window size."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

PROBE = r"""
import os, sys, fcntl, termios, struct
rows, cols = struct.unpack("hh", fcntl.ioctl(1, termios.TIOCGWINSZ, b"\0" * 4))
tty = open("/dev/tty", "w")
print("TTY", os.isatty(0), os.isatty(1), os.isatty(2), f"{rows}x{cols}", flush=True)
tty.write("DEVTTY-OK\n"); tty.flush()
print("GOT", input().strip(), flush=True)
"""


def _on_terminal(argv: list[str], timeout: float = 60,
                 when: tuple[bytes, ...] = (rb"DEVTTY-OK", rb"33x111\r*\n"),
                 typed: bytes = b"hello\n", env: dict[str, str] | None = None) -> str:
    """Run ``argv`` as a terminal session's foreground job (like a shell would); type ``typed``
    once all of ``when`` (patterns) was shown, line ends included: the terminal echoes what is
    typed, and the kernel may put that echo between a written line and its line end (n_tty
    writes a line's text and its newline as two pieces), with or without stalldoc. Returns
    everything the terminal showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("hhhh", 33, 111, 0, 0))

    def become_session() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=become_session, close_fds=True,
                            env={**os.environ, **(env or {})})
    os.close(slave)
    seen, done = b"", False
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready = select.select([master], [], [], 0.2)[0]
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        shown = seen.replace(b"DEVTTY-OK\r\n", b"").replace(b"DEVTTY-OK", b"")
        if not done and all(re.search(w, shown) or re.search(w, seen) for w in when):
            os.write(master, typed)
            done = True
        if proc.poll() is not None and not ready:
            break
    proc.wait(timeout=30)
    os.close(master)
    return seen.decode(errors="replace")


def _probe_lines(text: str) -> list[str]:
    """What the probe reported, sorted. Its /dev/tty line goes straight to the terminal while
    its stdout lines are relayed by stalldoc, so it can land anywhere among them, even between
    two pieces of one relayed line (and next to stalldoc's status line): it is taken out first."""
    devtty = re.findall(r"DEVTTY-OK", text)
    rest = re.sub(r"DEVTTY-OK\r?\n?", "", text)
    return sorted(devtty + re.findall(r"TTY \S+ \S+ \S+ \S+|GOT \w+", rest))


@pytest.mark.skipif(not os.path.exists("/dev/ptmx"), reason="no pseudo-terminals here")
def test_the_job_has_its_terminal_as_without_stalldoc(tmp_path):
    job = [sys.executable, "-c", PROBE]
    # GIVEN what the job sees on a terminal without stalldoc
    alone = _probe_lines(_on_terminal(job))
    assert alone == ["DEVTTY-OK", "GOT hello", "TTY True True True 33x111"], alone
    # WHEN the same job runs under stalldoc watch on the same kind of terminal
    watched = _on_terminal([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                            str(tmp_path / "run"), "--", *job])
    # THEN it sees the same: terminals on 0/1/2, the window size, /dev/tty, the typed line
    assert _probe_lines(watched) == alone, watched
    assert "job exited 0" in watched


@pytest.mark.skipif(not os.path.exists("/dev/ptmx"), reason="no pseudo-terminals here")
def test_ctrl_c_at_the_terminal_reaches_the_job_once(tmp_path):
    # GIVEN a watched job on a terminal that handles SIGINT and goes on
    printer = os.path.join(os.path.dirname(__file__), "..", "scenarios", "signal_printer.py")
    shown = _on_terminal([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                          str(tmp_path / "run"), "--", sys.executable, printer],
                         when=(rb"step 3",), typed=b"\x03",
                         env={"SIGNALS": "SIGINT", "LINES": "20", "EXIT_CODE": "0"})
    # WHEN Ctrl-C is typed, THEN the job gets one SIGINT (not one from the terminal and one
    # forwarded by stalldoc), runs to its end, and stalldoc reports its exit code
    assert shown.count("got SIGINT") == 1, shown
    assert "step 19" in shown and "done 1" in shown
    assert "job exited 0" in shown
