"""Python stacks of a rank's threads, and which thread is its main one."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    function: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.filename}:{self.line})"

    @property
    def name(self) -> str:
        """The function's own name: py-spy names methods by their qualified name on Python
        3.11+ (``_MultiProcessingDataLoaderIter._try_get_data``), the Flight Recorder does not."""
        return self.function.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python frames, innermost first."""

    thread_id: int
    name: str | None
    active: bool
    owns_gil: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class RankStacks:
    """All Python threads of a rank at one moment, and how they were obtained."""

    rank: int
    pid: int
    t: float
    method: str                 # "py-spy", "py-spy-nonblocking", "faulthandler", "none"
    threads: tuple[ThreadStack, ...]
    error: str = ""

    @property
    def main(self) -> ThreadStack | None:
        return main_thread(self.pid, self.threads)


# Where a worker process's main thread idles, waiting for its next task, while the work it was
# given runs on a thread of its own (Ray Train runs the training loop in a TrainingThread): the
# innermost frame's function and the end of its file.
IDLE_LOOPS = (("main_loop", "/ray/_private/worker.py"),)
# the kind of such a stack with no work on another thread: its next task comes from its driver
BETWEEN_TASKS = "waiting: next task"


_STDLIB = re.compile(r"/lib/python\d\.\d+/")


AGENT_FILES = "/stalldoc/agent/"   # the agent's own files: its heartbeat thread runs in them


def as_written(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """A thread's frames (innermost first) as the user wrote the program: without the
    pass-through ``wrapper`` frames of the agent's hooks (a framework's function it wraps to mark
    a phase, a collective or a channel), which sit between the user's call and the library's.
    A wrapper whose next frame inward is the agent's own stays: stalldoc's code runs there."""
    return tuple(f for i, f in enumerate(frames)
                 if not (i and _is_wrapper(f) and AGENT_FILES not in frames[i - 1].filename))


def _is_wrapper(frame: Frame) -> bool:
    return frame.name == "wrapper" and AGENT_FILES in frame.filename


def os_main_thread(pid: int, threads: tuple[ThreadStack, ...]) -> ThreadStack | None:
    """The process's own main thread: its os thread id is the pid (None: not among them)."""
    return next((t for t in threads if t.thread_id == pid), None)


def runs_agent(thread: ThreadStack) -> bool:
    """stalldoc's own heartbeat thread: a frame in the agent's files."""
    return any(AGENT_FILES in f.filename for f in thread.frames)


def main_thread(pid: int, threads: tuple[ThreadStack, ...]) -> ThreadStack | None:
    """The thread a rank's work runs on: its main thread (the os thread id is the pid; py-spy
    lists it first), unless that idles in a worker's task loop (``IDLE_LOOPS``) while another
    thread runs code of the job's own (not the standard library's, not an installed
    package's); then that thread, the one with the most such frames."""
    main = os_main_thread(pid, threads) or (threads[0] if threads else None)
    if main is None or not idles_in_task_loop(main):
        return main
    return max(threads, key=lambda t: (_own_frames(t), t is main))


def idles_in_task_loop(thread: ThreadStack) -> bool:
    """The thread waits in a worker's task loop for its next task (``IDLE_LOOPS``)."""
    if not thread.frames:
        return False
    top = thread.frames[0]
    return any(top.name == name and top.filename.endswith(path)
               for name, path in IDLE_LOOPS)


def _own_frames(thread: ThreadStack) -> int:
    """How many of a thread's frames are in the job's own files."""
    return sum(1 for f in thread.frames if not (
        "site-packages" in f.filename or "dist-packages" in f.filename
        or _STDLIB.search(f.filename) or f.filename.startswith("<")
        or AGENT_FILES in f.filename))   # the agent's own heartbeat thread


@dataclass(frozen=True)
class BuildLock:
    """The lock file of a torch C++ extension's build directory (``torch.utils.file_baton``):
    the one process that builds the extension holds it, every other one that loads it sleeps
    until the file is gone. Nothing removes it when the builder is killed. torch builds with
    ninja in that directory: while ninja runs there, the lock's build goes on."""

    path: str                     # .../torch_extensions/[py311_cu121/]NAME/lock
    age: float                    # seconds since it was written
    builders: tuple[int, ...]     # pids building in its directory: ninja there, and all with it
    # pids still working in its directory with no ninja there: the compilers of a build that was
    # stopped (ninja starts them in process groups of their own), which end without removing it
    leftovers: tuple[int, ...] = ()
