"""Reading Python stacks: the frame that matters, whether a thread waits on a lock or in a
collective, and which ranks stand apart from the rest."""
from __future__ import annotations

import linecache
import os
import re
import sysconfig
from collections import defaultdict
from typing import Mapping

from stalldoc.model import Frame, RankStacks, ThreadStack

_LIBRARY_DIRS = tuple({os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"],
                                                     sysconfig.get_paths()["purelib"],
                                                     sysconfig.get_paths()["platlib"])})
_LIBRARY_MARKERS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python3")
_OWN = os.sep + os.path.join("stalldoc", "agent") + os.sep
# Waits for a lock or for another thread to end; Event / Condition waits are waits for a signal.
_LOCK_FUNCTIONS = {"acquire", "_wait_for_tstate_lock", "join", "Thread.join",
                   "Thread._wait_for_tstate_lock", "Semaphore.acquire", "RLock.acquire"}
_LOCK_LINE = re.compile(r"\.acquire\(|^\s*(async\s+)?with\b.*(lock|mutex|cond|sem)", re.I)
_COLLECTIVE_FILES = (f"torch{os.sep}distributed{os.sep}",)
# Where a thread that waits for a server sits: the socket layer, an HTTP / RPC client library.
_NETWORK_FILES = (f"{os.sep}socket.py", f"{os.sep}ssl.py", f"http{os.sep}client.py",
                  f"urllib{os.sep}request.py", f"{os.sep}requests{os.sep}",
                  f"{os.sep}urllib3{os.sep}", f"{os.sep}httpx{os.sep}", f"{os.sep}httpcore{os.sep}",
                  f"{os.sep}aiohttp{os.sep}", f"{os.sep}grpc{os.sep}", f"{os.sep}openai{os.sep}")


def is_library(filename: str) -> bool:
    """Frames from the standard library, installed packages or stalldoc itself."""
    if _OWN in filename or filename.startswith("<frozen"):
        return True
    real = os.path.realpath(filename)
    return real.startswith(_LIBRARY_DIRS) or any(m in filename for m in _LIBRARY_MARKERS)


def user_frame(thread: ThreadStack) -> Frame | None:
    """The innermost frame in the user's own code (else the innermost frame)."""
    for frame in thread.frames:
        if not is_library(frame.filename):
            return frame
    return thread.frames[0] if thread.frames else None


def frame_strings(thread: ThreadStack | None) -> list[str]:
    """``func (file:line)``, innermost first: the report's ``evidence.frames``."""
    return [str(f) for f in thread.frames] if thread else []


def in_collective(thread: ThreadStack | None) -> bool:
    """The thread is inside torch.distributed (a collective, barrier or object collective)."""
    return bool(thread) and any(m in f.filename for f in thread.frames for m in _COLLECTIVE_FILES)


def waits_on_network(thread: ThreadStack | None) -> Frame | None:
    """The user's frame that called into a socket / HTTP / RPC client the thread is blocked in."""
    if thread is None or not thread.frames or in_collective(thread):
        return None
    if not any(m in f.filename for f in thread.frames[:12] for m in _NETWORK_FILES):
        return None
    return user_frame(thread)


def waits_on_lock(thread: ThreadStack) -> Frame | None:
    """The frame where an idle thread blocks on a lock / condition / join, if it does."""
    if thread.active or not thread.frames:
        return None
    inner = thread.frames[0]
    if os.path.basename(inner.filename) == "threading.py" and inner.function in _LOCK_FUNCTIONS:
        return next((f for f in thread.frames if not is_library(f.filename)), inner)
    if not is_library(inner.filename) and _LOCK_LINE.search(
            linecache.getline(inner.filename, inner.line)):
        return inner
    return None


def signature(stacks: RankStacks, with_lines: bool = True) -> tuple:
    """What identifies a rank's state: its threads' frames (with lines to see a loop move)."""
    return tuple(tuple((f.function, f.filename, f.line if with_lines else 0) for f in t.frames)
                 for t in stacks.threads)


def group_by_main_stack(stacks: Mapping[int, RankStacks]) -> list[tuple[tuple, list[int]]]:
    """Ranks grouped by their main thread's frames (functions and files), largest group first."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for rank, rank_stacks in stacks.items():
        main = rank_stacks.main
        key = tuple((f.function, f.filename) for f in main.frames) if main else ()
        groups[key].append(rank)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
