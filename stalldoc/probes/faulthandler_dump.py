"""Ask a rank's agent for a faulthandler dump (a signal) and parse what it writes.

The fallback when ptrace is denied: Python frames only, and only from ranks whose agent
registered the signal. A stopped rank cannot answer until it is continued.
"""
from __future__ import annotations

import os
import re
import signal
import time

from stalldoc.agent.runtime import DEFAULT_DUMP_SIGNAL
from stalldoc.model import Frame, ThreadStack

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse(text: str, pid: int) -> tuple[ThreadStack, ...]:
    """Parse one faulthandler dump (most recent call first). The thread whose outermost frame is
    ``<module>`` is the main thread; it gets the pid as its id, as py-spy gives it."""
    threads: list[tuple[int, list[Frame]]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append((int(head.group(2), 16), []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(Frame(frame.group(3), frame.group(1), int(frame.group(2))))
    out = []
    for ident, frames in threads:
        is_main = bool(frames) and frames[-1].function == "<module>"
        out.append(ThreadStack(pid if is_main else ident, "MainThread" if is_main else None,
                               False, False, tuple(frames)))
    return tuple(out)


def request(agent_dir: str, pid: int, timeout: float = 2.0) -> tuple[ThreadStack, ...]:
    """Signal ``pid`` and wait for its dump to appear; empty when none comes."""
    path = os.path.join(agent_dir, f"faulthandler-{pid}.txt")
    if not os.path.exists(path):
        return ()
    start = os.path.getsize(path)
    try:
        os.kill(pid, getattr(signal, DEFAULT_DUMP_SIGNAL))
    except OSError:
        return ()
    deadline = time.time() + timeout
    size = start
    while time.time() < deadline:
        time.sleep(0.05)
        new = os.path.getsize(path)
        if new > start and new == size:
            break
        size = new
    with open(path, encoding="utf-8", errors="replace") as fh:
        fh.seek(start)
        return parse(fh.read(), pid)
