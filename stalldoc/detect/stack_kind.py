"""The kind of a rank's stack: working, or waiting (and on what).

A thread waits when it is blocked or spinning in a call whose job is to wait for something else:
a collective, a lock / condition / queue, a sleep, select / poll / a socket receive, a c10d store
get, a child process or pool, a future, or a CUDA synchronisation (``.item()``, ``.cpu()``,
``synchronize()``). CPU spent spinning in such a call is not work. A rank is *working* when its
main thread is active in another frame, or, while the main thread waits on the rank's own
threads (a lock, a queue, a future, an event loop, or sleeps between polls of them), when
another of its Python threads (stalldoc's own excepted) is.
"""
from __future__ import annotations

import linecache
import os
import re
import sysconfig

from dataclasses import dataclass

from stalldoc import engines
from stalldoc.model.stacks import (BETWEEN_TASKS, Frame, RankStacks, ThreadStack,
                                   idles_in_task_loop)

WORKING = "working"
# BETWEEN_TASKS (model/stacks.py): a task executor's worker (a Ray worker) whose main thread idles
# in its task loop and that runs no work on another thread: no work in hand, its next task comes
# from its driver.


@dataclass(frozen=True)
class StackKind:
    """A classified stack: ``kind`` is "working" or "waiting: <why>" ('' with no stacks at
    all); ``shape`` the deciding thread's functions and files (no lines), to tell an unchanging
    stack."""

    kind: str
    frame: Frame | None = None        # the deciding thread's user frame (else its innermost)
    shape: tuple[tuple[str, str], ...] = ()
    on_cpu: bool = True               # some Python thread was running (unknown: True)
    thread: int = 0                   # the deciding thread's os thread id (0 unknown)

    @property
    def signature(self) -> tuple[int, tuple[tuple[str, str], ...]]:
        """The deciding thread and its shape: the same thread in the same functions."""
        return self.thread, self.shape

    @property
    def working(self) -> bool:
        return self.kind == WORKING
COLLECTIVE_FILES = (f"torch{os.sep}distributed{os.sep}",)
NETWORK_FILES = (f"{os.sep}socket.py", f"{os.sep}ssl.py", f"http{os.sep}client.py",
                 f"urllib{os.sep}request.py", f"{os.sep}requests{os.sep}",
                 f"{os.sep}urllib3{os.sep}", f"{os.sep}httpx{os.sep}", f"{os.sep}httpcore{os.sep}",
                 f"{os.sep}aiohttp{os.sep}", f"{os.sep}grpc{os.sep}", f"{os.sep}openai{os.sep}")
_OWN = os.sep + os.path.join("stalldoc", "agent") + os.sep
_LIBRARY_DIRS = tuple({os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"],
                                                     sysconfig.get_paths()["purelib"],
                                                     sysconfig.get_paths()["platlib"])})
_IMPORTLIB = "<frozen importlib."
_LIBRARY_MARKERS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python3")
# (file pattern, function names or None for any) -> what the thread waits on; "multiprocess" is
# the dill-based fork that HF datasets uses. A name is a function's own name: py-spy gives a
# method's qualified one on Python 3.11+ (``Condition.wait``), matched by its last part
_WAIT_FRAMES: tuple[tuple[str, frozenset[str] | None, str], ...] = (
    ("threading.py", frozenset({"wait", "acquire", "join", "_wait_for_tstate_lock", "get"}),
     "lock"),
    ("queue.py", frozenset({"get", "put", "join"}), "queue"),
    (f"multiprocess(ing)?{os.sep}connection.py", None, "child process"),
    (f"multiprocess(ing)?{os.sep}pool.py", frozenset({"get", "wait", "join", "map", "starmap",
                                                   "imap", "next", "__next__"}), "worker pool"),
    (f"multiprocess(ing)?{os.sep}synchronize.py", None, "lock"),
    (f"multiprocess(ing)?{os.sep}popen_fork.py", None, "child process"),
    (f"multiprocess(ing)?{os.sep}queues.py", frozenset({"get", "put", "join"}), "queue"),
    ("subprocess.py", frozenset({"wait", "_wait", "_try_wait", "communicate", "_communicate",
                                 "run", "call", "check_call", "check_output"}), "subprocess"),
    ("selectors.py", None, "select"),
    (f"concurrent{os.sep}futures{os.sep}_base.py", frozenset({"result", "wait", "as_completed",
                                                             "__get_result"}), "future"),
    (f"concurrent{os.sep}futures{os.sep}thread.py", frozenset({"_worker"}), "queue"),
    (f"asyncio{os.sep}base_events.py", frozenset({"_run_once", "run_forever",
                                                  "run_until_complete"}), "event loop"),
    (f"torch{os.sep}cuda{os.sep}__init__.py", frozenset({"synchronize"}), "cuda sync"),
    (f"torch{os.sep}cuda{os.sep}streams.py", frozenset({"synchronize", "wait_event",
                                                        "wait_stream"}), "cuda sync"),
    (f"torch{os.sep}utils{os.sep}data{os.sep}dataloader.py", frozenset({
        "_try_get_data", "_get_data", "_next_data"}), "dataloader workers"),
    # a Ray driver (or actor) waiting for the result of a task or an actor call
    (f"ray{os.sep}_private{os.sep}worker.py", frozenset({"get_objects", "get", "wait"}),
     "ray.get"),
    (f"ray{os.sep}util{os.sep}collective{os.sep}.+.py", None, "collective"),   # ray.util.collective
    # DeepSpeed's comm layer and ZeRO's own collectives (ZeRO-3's parameter all-gather)
    (f"deepspeed{os.sep}comm{os.sep}(comm|torch).py", None, "collective"),
    (f"deepspeed{os.sep}runtime{os.sep}comm{os.sep}coalesced_collectives.py", None, "collective"),
    (f"deepspeed{os.sep}runtime{os.sep}zero{os.sep}partition_parameters.py",
     frozenset({"all_gather_coalesced", "wait", "_all_gather", "_allgather_params",
                "_allgather_params_coalesced"}), "collective"),
    # each rollout engine's own waits (its group coordinator, device communicators, message
    # queue, weight-sync groups: stalldoc/engines)
    *((w.file.replace("/", os.sep), w.names, w.why) for w in engines.wait_frames()),
    # a copy of an engine's device communicators another package carries (vendored PyNccl)
    (f"device_communicators{os.sep}(pynccl|pynccl_wrapper|custom_all_reduce|quick_all_reduce"
     ").py", None, "collective"),
)
# waits on another thread of the same process: while the main thread sits in one, the rank's
# other threads' work is its work. A sleep is one too: `while worker.is_alive(): time.sleep(1)`
# is how many jobs wait for a thread, and calling that rank idle would be a false stall.
IN_PROCESS_WAITS = frozenset({"lock", "queue", "future", "event loop", "sleep"})
def file_pattern(tail: str) -> re.Pattern[str]:
    """A frame's file whose path ends in ``tail`` (a regex of the path's tail, ".py" last)."""
    return re.compile(re.escape(os.sep) + tail.replace(".py", r"\.py") + "$")


def frame_in(frame: Frame, pattern: re.Pattern[str], names: frozenset[str] | None) -> bool:
    """``frame`` is one of ``names`` (any, for None: a method by its own name too) in a file
    that ``pattern`` (``file_pattern``) matches."""
    return (names is None or frame.function in names or frame.name in names) \
        and bool(pattern.search(frame.filename))


_WAIT_FILES = tuple((file_pattern(pattern), names, why) for pattern, names, why in _WAIT_FRAMES)
# A user line blocked in a C call that waits: sleep, CUDA sync, a socket, a store or an event.
_WAIT_LINE = (
    (re.compile(r"\bsleep\("), "sleep"),
    (re.compile(r"\.(item|cpu|tolist)\(\)|\bsynchronize\("), "cuda sync"),
    (re.compile(r"\.(recv|recv_into|recvfrom|accept|connect)\("), "socket"),
    (re.compile(r"\bstore\.(get|wait)\("), "c10d store"),
    (re.compile(r"\.(wait|acquire)\("), "lock"),
    (re.compile(r"\b(select|poll|epoll)\.?\w*\("), "select"),
)


_SPINNING_LINE_WAITS = frozenset({"cuda sync"})


def is_library(filename: str) -> bool:
    """Frames from the standard library, installed packages or stalldoc itself."""
    if _OWN in filename or filename.startswith("<frozen"):
        return True
    real = os.path.realpath(filename)
    return real.startswith(_LIBRARY_DIRS) or any(m in filename for m in _LIBRARY_MARKERS)


def is_own(thread: ThreadStack) -> bool:
    """A thread stalldoc's agent started (its heartbeat): its outermost frame outside
    threading.py is the agent's. A job's thread that passes through the agent (a collective
    wrapped by it) is the job's."""
    outer = next((f for f in reversed(thread.frames)
                  if not f.filename.endswith(f"{os.sep}threading.py")), None)
    return outer is not None and _OWN in outer.filename


def frame_wait(frame: Frame, collective: bool = True) -> str:
    """What ``frame`` waits on when a thread sits in it ('' when it is not a waiting call).
    ``collective=False``: torch.distributed's files are no collective (their module and class
    bodies run while torch.distributed is imported)."""
    if collective and any(m in frame.filename for m in COLLECTIVE_FILES):
        return "collective"
    for pattern, names, why in _WAIT_FILES:
        if frame_in(frame, pattern, names):
            return why
    if any(m in frame.filename for m in NETWORK_FILES):
        return "socket"
    return ""


def line_wait(frame: Frame, running: bool = False) -> str:
    """What a C call on ``frame``'s source line waits on ('' when the line is not a wait).
    ``running``: the thread was seen on the CPU, where only a wait that spins (a CUDA sync) can
    be; a lock, a sleep, a socket or a poll there is taken or returns at once (an uncontended
    ``_lock.acquire()`` in logging's ``getLogger``), a wait blocks in the kernel."""
    text = linecache.getline(frame.filename, frame.line) if frame.line > 0 else ""
    for pattern, why in _WAIT_LINE:
        if pattern.search(text) and (why in _SPINNING_LINE_WAITS or not running):
            return why
    return ""


def thread_wait(thread: ThreadStack, use_active: bool = True) -> str:
    """What the thread waits on, or '' when it is working.

    The thread sits where its innermost frames are: library frames are read from the innermost
    out up to the first frame of the user's own code; the innermost frame's source line tells a
    C call that waits (``time.sleep``, ``.item()``). A thread py-spy saw idle (blocked in the
    kernel) waits even in a frame we do not know; stacks without that flag (faulthandler) are
    read from their frames alone (``use_active=False``). A thread that imports works
    (torch.distributed's own module bodies run then, no collective), unless it waits for the
    import lock, or a call of the module's body waits."""
    if not thread.frames:
        return "no python frames"
    walk = _walk(thread.frames)
    importing = any(f.filename.startswith(_IMPORTLIB) for f in walk)
    running = thread.active and use_active
    for index, frame in enumerate(walk):
        if frame.filename.startswith(_IMPORTLIB):
            if frame.name == "acquire" and not running:
                return "lock"   # the import lock: another thread imports that module
            break   # an import runs (finds, reads, compiles or executes a module; a thread
            # on the CPU in the lock's acquire takes it, it does not wait for it)
        why = frame_wait(frame, not importing) or (line_wait(frame, running) if index == 0 else "")
        if why:
            return why
    return "" if thread.active or not use_active else "blocked"


def _walk(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The innermost frames up to and with the first of the user's own code."""
    user = next((i for i, f in enumerate(frames) if not is_library(f.filename)), len(frames))
    return frames[:user + 1]


def _user_frame(thread: ThreadStack) -> Frame | None:
    """The innermost frame of the user's own code, else the innermost frame."""
    return next((f for f in thread.frames if not is_library(f.filename)),
                thread.frames[0] if thread.frames else None)


def _shape(thread: ThreadStack) -> tuple[tuple[str, str], ...]:
    return tuple((f.function, f.filename) for f in thread.frames)


def classify(stacks: RankStacks, phase_thread: int = 0) -> StackKind:
    """The main thread decides, and the thread that entered the rank's innermost phase
    (``phase_thread``, its native id from the agent; 0: unknown) with it: the rank works when
    either works, else it waits on what the main thread waits on. Only while the main thread
    waits on the rank's own threads (a lock, a queue, a future, an event loop: a join, an
    executor, a worker thread's result) does any other Python thread (stalldoc's own excepted)
    that works make the rank work. A background thread busy while the main thread waits in a
    collective, a socket or a sleep is not the rank's work, unless its phase is the rank's."""
    threads = [t for t in stacks.threads if not is_own(t) and t.frames]
    if not threads:   # no Python frames at all (starting, ending, or native): cannot tell
        return StackKind("")
    main = stacks.main if stacks.main in threads else threads[0]
    use_active = stacks.method != "faulthandler"
    if idles_in_task_loop(main):
        busy = next((t for t in threads if t is not main and not thread_wait(t, use_active)),
                    None)
        return _working(busy) if busy is not None else StackKind(
            BETWEEN_TASKS, main.frames[0], _shape(main), False, main.thread_id)
    waits = thread_wait(main, use_active)
    if not waits:
        return _working(main)
    phased = next((t for t in threads if t.thread_id == phase_thread and t is not main), None)
    if phased is not None and not thread_wait(phased, use_active):
        return _working(phased)
    if waits in IN_PROCESS_WAITS:
        for thread in threads:
            if thread is not main and not thread_wait(thread, use_active):
                return _working(thread)
    on_cpu = not use_active or any(t.active for t in threads)
    return StackKind(f"waiting: {waits}", _user_frame(main), _shape(main), on_cpu, main.thread_id)


def _working(thread: ThreadStack) -> StackKind:
    return StackKind(WORKING, _user_frame(thread), _shape(thread), True, thread.thread_id)
