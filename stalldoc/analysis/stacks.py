"""Reading Python stacks: the frame that matters, whether a thread waits on a lock or in a
collective, and which ranks stand apart from the rest."""
from __future__ import annotations

import linecache
import os
import re
from collections import defaultdict
from typing import Mapping

from stalldoc import engines
from stalldoc.detect.stack_kind import (COLLECTIVE_FILES, IN_PROCESS_WAITS, NETWORK_FILES,
                                        classify, file_pattern, frame_in, frame_wait,
                                        is_library, is_own, thread_wait)
from stalldoc.model.kernel import KernelWait
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack

__all__ = ["is_library", "user_frame", "frame_strings", "in_collective", "waits_on_network",
           "waits_on_http", "server_wait",
           "waits_on_lock", "waits_on_build_lock", "signature", "group_by_main_stack",
           "child_wait", "CHILD_WAITS", "handling", "INNER_EXPRESSIONS", "own_function"]

# What a thread waits for when it waits on the rank's own processes, and what they are called
# (the most specific first).
CHILD_WAITS = {"dataloader workers": "DataLoader worker", "worker pool": "pool worker",
               "child process": "child process", "subprocess": "subprocess"}

BUILD_LOCK_FILE = "torch/utils/file_baton.py"
CPP_EXTENSION_FILE = "torch/utils/cpp_extension.py"

# Waits for a lock or for another thread to end; Event / Condition waits are waits for a signal.
_LOCK_FUNCTIONS = {"acquire", "_wait_for_tstate_lock", "join", "Thread.join",
                   "Thread._wait_for_tstate_lock", "Semaphore.acquire", "RLock.acquire"}
_ACQUIRE = re.compile(r"\.acquire\(")
_WITH = re.compile(r"^\s*(?:async\s+)?with\b(.*)")
_LOCK_WORDS = frozenset({"lock", "rlock", "locks", "mutex", "cond", "condition", "sem",
                         "semaphore", "boundedsemaphore"})


def is_lock_line(text: str) -> bool:
    """A source line that takes a lock: ``x.acquire(``, or ``with`` on a name with a lock word
    (``self._lock``, ``cache_lock``, ``threading.Lock()``); comments and strings that merely
    contain "lock" (``# blocks here``) are not."""
    code = text.split("#", 1)[0]
    if _ACQUIRE.search(code):
        return True
    found = _WITH.match(code)
    words = re.split(r"[^A-Za-z]+|_", found.group(1)) if found else []
    return any(w.lower() in _LOCK_WORDS for w in words)


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
    return bool(thread) and any(m in f.filename for f in thread.frames for m in COLLECTIVE_FILES)


def waits_in_engine_collective(thread: ThreadStack | None) -> Frame | None:
    """The frame of a rollout engine's tensor-parallel collective the thread waits in, among
    its innermost frames: an engine run inside the rank (vLLM colocated, ``external_launcher``)
    waits there for the other ranks of its TP group. The innermost communicator's frame (vLLM's
    CPU shared-memory one; PyNccl, custom all-reduce or symmetric memory on GPUs), where the
    engine's group coordinator called it: PyNccl called by a weight sync is no TP collective."""
    if thread is None:
        return None
    inner = thread.frames[:8]
    waits = [frame_wait(f) for f in inner]
    engine = next((e for e in engines.ENGINES if e.tp_collective in waits), None)
    if engine is None:
        return None
    return next(f for f, why in zip(inner, waits) if why in (engine.tp_collective,
                                                            engine.collective))


# each engine's data-parallel syncs: (file's path tail, function names, the engine)
_DP_SYNC = tuple((file_pattern(w.file.replace("/", os.sep)), w.names, engine)
                 for engine in engines.ENGINES for w in engine.dp_sync)
_DP_SYNC_DEPTH = 12   # a sync's frame sits a few frames out of the collective it waits in


def waits_in_engine_dp_sync(thread: ThreadStack | None) -> tuple[engines.Engine, Frame] | None:
    """(the engine, its frame) when the thread waits in a collective a rollout engine's
    data-parallel replica makes to sync with the other replicas (vLLM's ``has_unfinished_dp``
    after each step, ``coordinate_batch_across_dp`` before a forward; SGLang's DP-attention
    batch exchange): it ends only when every replica of its DP group comes. None otherwise."""
    if thread is None or not (in_collective(thread) or waits_in_engine_collective(thread)):
        return None
    for frame in thread.frames[:_DP_SYNC_DEPTH]:
        for pattern, names, engine in _DP_SYNC:
            if frame_in(frame, pattern, names):
                return engine, frame
    return None


# each engine's name and what its package's files have in their path
_ENGINE_DIRS = tuple((e.name, f"{os.sep}{e.package}{os.sep}") for e in engines.ENGINES)


def engine_code(thread: ThreadStack | None) -> str:
    """The name of the rollout engine whose package's code the thread is in (``LLM.generate``
    waiting for vLLM's engine core, SGLang's ``Engine.generate``), '' for none."""
    frames = thread.frames if thread is not None else ()
    return next((name for name, mark in _ENGINE_DIRS
                 if any(mark in f.filename for f in frames)), "")


def engine_frame(thread: ThreadStack | None) -> Frame | None:
    """The thread's innermost frame of a rollout engine's own code, None for none."""
    frames = thread.frames if thread is not None else ()
    return next((f for f in frames if any(mark in f.filename for _, mark in _ENGINE_DIRS)),
                None)


def engine_standing(stacks: RankStacks | None) -> Frame | None:
    """Where an engine process stands: the innermost frame of the engine's own code in its main
    thread (else its innermost frame); None where its stack was not read."""
    main = stacks.main if stacks is not None else None
    if main is None or not main.frames:
        return None
    return engine_frame(main) or main.frames[0]


# torch.compile's own code: a thread with a frame in it compiles (the C++ compiler, when it runs,
# is its child process)
_COMPILER_DIRS = tuple(f"{os.sep}torch{os.sep}{d}{os.sep}" for d in ("_inductor", "_dynamo"))


def compiling(stacks: RankStacks | None) -> bool:
    """The process's main thread is inside torch.compile (dynamo tracing, inductor's codegen,
    or waiting on the C++ compiler it started)."""
    main = stacks.main if stacks is not None else None
    return main is not None and any(d in f.filename for f in main.frames for d in _COMPILER_DIRS)


def in_process_engine(name: str) -> bool:
    """The engine runs in the process that holds it, its workers that process's children
    (SGLang's schedulers), rather than under a core process of its own (vLLM's)."""
    engine = engines.by_name(name)
    return engine is not None and not engine.core_process


def waits_on_network(thread: ThreadStack | None) -> Frame | None:
    """The user's frame that called into a socket / HTTP / RPC client the thread is blocked in."""
    if thread is None or not thread.frames or in_collective(thread):
        return None
    if not any(m in f.filename for f in thread.frames[:12] for m in NETWORK_FILES):
        return None
    return user_frame(thread)


def server_wait(stacks: RankStacks) -> ThreadStack | None:
    """The thread of a rank that waits on a server's reply: its main thread, or, while the main
    thread waits on the rank's own threads (a future, a queue, a lock, an event loop), the
    thread that waits on the server for it (swift 3.x's rollout client posts from an executor
    thread while the main thread waits on its future). None when neither does."""
    main = stacks.main
    if waits_on_network(main) is not None:
        return main
    if main is None or thread_wait(main) not in IN_PROCESS_WAITS:
        return None
    return next((t for t in stacks.threads if t is not main and not is_own(t)
                 and waits_on_network(t) is not None), None)


# clients that speak plain HTTP (TLS, gRPC and raw sockets left out)
HTTP_CLIENT_FILES = (f"http{os.sep}client.py", f"urllib{os.sep}request.py",
                     f"{os.sep}requests{os.sep}", f"{os.sep}urllib3{os.sep}",
                     f"{os.sep}httpx{os.sep}", f"{os.sep}httpcore{os.sep}",
                     f"{os.sep}aiohttp{os.sep}", f"{os.sep}openai{os.sep}")


def waits_on_http(thread: ThreadStack | None) -> bool:
    """The thread waits in a plain HTTP client (no TLS frame): its server answers HTTP."""
    if waits_on_network(thread) is None or thread is None:
        return False
    frames = thread.frames[:16]
    return (any(m in f.filename for f in frames for m in HTTP_CLIENT_FILES)
            and not any(f.filename.endswith(f"{os.sep}ssl.py") for f in frames))


def waits_on_build_lock(thread: ThreadStack | None) -> Frame | None:
    """The frame that loads a C++ extension (torch's ``cpp_extension.load``, DeepSpeed's op
    builders) while the thread sleeps on the extension's build lock (``FileBaton.wait``)."""
    if thread is None or not thread.frames:
        return None
    inner = next((i for i, f in enumerate(thread.frames[:4])
                  if f.filename.endswith(BUILD_LOCK_FILE) and f.name == "wait"), None)
    if inner is None:
        return None
    outer = thread.frames[inner + 1:]
    return next((f for f in outer if not f.filename.endswith(CPP_EXTENSION_FILE)
                 and "/torch/" not in f.filename), user_frame(thread))


def waits_on_lock(thread: ThreadStack) -> Frame | None:
    """The frame where an idle thread blocks on a lock / condition / join, if it does."""
    if thread.active or not thread.frames:
        return None
    inner = thread.frames[0]
    if os.path.basename(inner.filename) == "threading.py" and inner.function in _LOCK_FUNCTIONS:
        return next((f for f in thread.frames if not is_library(f.filename)), inner)
    if not is_library(inner.filename) and is_lock_line(
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


def child_wait(thread: ThreadStack | None) -> str:
    """What the thread waits for among the rank's own processes ("DataLoader worker", "pool
    worker", "child process", "subprocess"), from any of its frames (the innermost ones may be
    the select / poll under the wait; the most specific wins: a DataLoader's fetch sits on a
    child's pipe); '' when it waits on none."""
    found = {frame_wait(f) for f in thread.frames} if thread is not None else set()
    return next((name for why, name in CHILD_WAITS.items() if why in found), "")


def blocked_in_io(stacks: RankStacks | None, wait: KernelWait) -> bool:
    """Whether the process waits in I/O: its main thread is blocked in a system call on a file,
    a pipe, a device or a socket (or uninterruptible), and its stack does no work (a thread
    that reads a fast file in a loop is caught in ``read`` too, and works)."""
    return wait.io and stacks is not None and bool(stacks.threads) \
        and not classify(stacks).working


# frames of an expression inside a function (a generator expression, a comprehension, a
# lambda): what runs there runs in that function
INNER_EXPRESSIONS = frozenset({"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>"})
# where a server's thread waits between requests: its event loop, a select, its pool's queue
_SERVER_IDLE = frozenset({"select", "event loop", "queue", "socket"})


def own_function(thread: ThreadStack) -> Frame | None:
    """The innermost frame of the user's own code that is a function's, not an expression's
    inside it (a comprehension's frame is its function's line); None when there is none."""
    return next((f for f in thread.frames if not is_library(f.filename)
                 and f.name not in INNER_EXPRESSIONS), None)


def handling(stacks: RankStacks) -> tuple[ThreadStack, Frame, str] | None:
    """Where a server handles a request: the first of its threads (stalldoc's own excepted)
    that reaches the user's own code and is not idle between requests (in its event loop, a
    select, its pool's queue, an accept); with its innermost user frame and what it waits on
    ('' when it works). None when no thread is (an async handler awaits off every stack)."""
    for thread in stacks.threads:
        if is_own(thread) or not thread.frames:
            continue
        frame = own_function(thread)
        wait = thread_wait(thread)
        if frame is not None and wait not in _SERVER_IDLE:
            return thread, frame, wait
    return None
