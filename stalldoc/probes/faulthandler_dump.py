"""Ask a rank's agent for a faulthandler dump (a signal) and parse what it writes.

The fallback when ptrace is denied: Python frames only, and only from ranks whose agent
registered the signal. A stopped rank cannot answer until it is continued.
"""
from __future__ import annotations

import os
import re
import time

from stalldoc.agent.statefile import state_path
from stalldoc.agent.state_reader import StateFileError, read_state
from stalldoc.model.agent import AgentIdentity
from stalldoc.model.stacks import Frame, ThreadStack, as_written

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse(text: str, pid: int) -> tuple[ThreadStack, ...]:
    """Parse one faulthandler dump (most recent call first). The thread whose outermost frame is
    ``<module>`` is the main thread; it gets the pid as its id, as py-spy gives it. The agent's
    pass-through wrappers are left out."""
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
                               False, False, as_written(tuple(frames))))
    return tuple(out)


def safe_signal(agent_dir: str, pid: int) -> int:
    """The dump signal ``pid`` may be sent, or 0. Only when that very process registered the
    agent's handler, still runs the program it registered it in (an exec'd process would be
    killed by the signal) and still catches the signal. The program is told by its executable
    where /proc lets us see it, else (a non-dumpable process, no CAP_SYS_PTRACE) by its name."""
    try:
        identity = read_state(state_path(agent_dir, pid)).identity
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
        caught = int(status.get("SigCgt", "0"), 16)
    except (OSError, StateFileError, ValueError):
        return 0
    if identity is None or not identity.dump_signal or not caught >> (identity.dump_signal - 1) & 1:
        return 0
    return identity.dump_signal if _same_program(pid, identity, status.get("Name", "")) else 0


def _same_program(pid: int, identity: AgentIdentity, name: str) -> bool:
    try:
        exe = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return bool(identity.comm) and name == identity.comm
    return (exe.st_dev, exe.st_ino) == (identity.exe_dev, identity.exe_ino)


def request(agent_dir: str, pid: int, timeout: float = 2.0) -> tuple[ThreadStack, ...]:
    """Signal ``pid`` and wait for its dump to appear; empty when none comes or when the
    process may not be signalled (``safe_signal``)."""
    path = os.path.join(agent_dir, f"faulthandler-{pid}.txt")
    signum = safe_signal(agent_dir, pid)
    if not signum or not os.path.exists(path):
        return ()
    start = os.path.getsize(path)
    try:
        os.kill(pid, signum)
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
