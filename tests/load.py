"""Load and slow-storage helpers for tests (standard library only).

- ``cpu_burner(n)``: at least ``n`` separate Python processes spinning on a core each, for the
  duration of a ``with`` block (a loaded node). The spinners are the machine's, not the block's:
  blocks that overlap share them, so each block still runs on cores that ``n`` spinners keep
  busy. In the suite's parallel run a test with a load runs alone (tests/machine.py: it fails
  if it was not marked so), so its load is the only one, and no other test runs beside it.
- ``starved(root)``: the process ``root`` and its descendants moved onto one CPU that many
  spinning processes share (an oversubscribed node: the job runs, at a few % of a core).
- ``slow_reader(path, rate)``: a FIFO at ``path`` whose other end a separate process drains at
  about ``rate`` bytes/s (a slow network file system that a job writes a checkpoint to).
- ``slow_writer(path, total, rate)``: a FIFO at ``path`` that a separate process fills with
  ``total`` bytes at about ``rate`` bytes/s, then closes (EOF) (slow storage a job reads from).
- ``silent_server()``: a TCP server on 127.0.0.1 that accepts connections and never answers
  (a hung reward model / inference server); yields its port.

Every peer is a real process started here with ``subprocess.Popen([sys.executable, "-c", ...])``
in a session of its own, so it is never part of the job under test (nor of its process group);
each is killed and reaped when its ``with`` block ends, also on exceptions.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Set

from machine import assert_alone

# spins until its parent is gone: a test run that is killed (no ``finally``) leaves no burner
# behind to load every later run on the machine
_BURN = ("import os\nparent = os.getppid()\nprint(flush=True)\n"
         "while os.getppid() == parent:\n    for _ in range(200000):\n        pass\n")

# the same, on one CPU (argv[1])
_BURN_ON = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\n" + _BURN

# Both peers pace themselves against the clock (bytes so far / rate), so short stalls on the
# job's side are caught up and the average rate holds. argv: path, rate, chunk[, total].
_READER = """\
import os, sys, time
path, rate, chunk = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
start, done = time.monotonic(), 0
while True:
    data = os.read(fd, chunk)
    if not data:
        break
    done += len(data)
    delay = start + done / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
os.close(fd)
"""

_WRITER = """\
import os, sys, time
path, rate, chunk, total = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY)
start, done, block = time.monotonic(), 0, os.urandom(chunk)
try:
    while done < total:
        done += os.write(fd, block[:min(chunk, total - done)])
        delay = start + done / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
except BrokenPipeError:
    pass
os.close(fd)
"""

_SILENT_SERVER = """\
import socket, sys, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)
clients = []
while True:
    conn, _ = srv.accept()
    clients.append(conn)  # keep it open, read nothing, answer nothing
"""


def _spawn(code: str, *args: object, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            start_new_session=True, stdin=subprocess.DEVNULL, **kwargs)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _chunk_for(rate_bytes_per_s: float) -> int:
    """About 20 chunks a second, between 4 KiB and 1 MiB."""
    return int(min(1 << 20, max(4096, rate_bytes_per_s / 20)))


def _spinning(procs: List[subprocess.Popen]) -> None:
    """Wait until every spinner has started its loop (its one empty line; EOF if it died): on a
    loaded machine, starting a Python process takes seconds, and a block that ran before its
    load was there would test an idle machine."""
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.readline()
        proc.stdout.close()


# A machine-wide spinner: spins while any process in the state file's "users" lives (checked
# each second), so that spinners shared by blocks of several test processes outlive the one that
# started them, and a killed test run leaves none behind. argv[1]: the state files' prefix.
_SHARED_BURN = """\
import json, os, sys, time
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
def users():
    try:
        with open(sys.argv[1] + ".json") as fh:
            return json.load(fh)["users"]
    except (OSError, ValueError, KeyError):
        return []
open(f"{sys.argv[1]}.ready.{os.getpid()}", "w").close()
while any(alive(pid) for pid in users()):
    end = time.monotonic() + 1
    while time.monotonic() < end:
        for _ in range(20000):
            pass
"""

_BURNERS = os.path.join(tempfile.gettempdir(), f"stalldoc-tests-cpu-burner-{os.getuid()}")


@contextlib.contextmanager
def cpu_burner(processes: int = 2) -> Iterator[List[int]]:
    """At least ``processes`` separate Python processes, each spinning on one core, while the
    block runs (it starts once they spin); their pids. Spinners already running for another
    block (a parallel worker's) count: a block only adds the ones missing, and the last block
    to end stops them."""
    if processes <= 0:
        yield []
        return
    assert_alone("a CPU burner")
    with _burners_locked() as state:
        state["users"].append(os.getpid())
        _save_burners(state)
        new = [_spawn(_SHARED_BURN, _BURNERS) for _ in range(processes - len(state["pids"]))]
        state["pids"] += [proc.pid for proc in new]
        _save_burners(state)
    try:
        _shared_spinning(state["pids"])
        yield list(state["pids"])
    finally:
        with _burners_locked() as state:
            state["users"].remove(os.getpid())
            if not state["users"]:
                for pid in state["pids"]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.unlink(f"{_BURNERS}.ready.{pid}")
                state["pids"] = []
            _save_burners(state)
        for proc in new:   # reaped once dead; ones still spinning for other blocks are left
            if proc.poll() is None and state["pids"]:
                continue
            proc.wait()


@contextlib.contextmanager
def _burners_locked() -> Iterator[Dict[str, List[int]]]:
    """The shared spinners' state (``users``: pids of the processes in a block, one entry per
    block; ``pids``: the live spinners), under an exclusive lock; dead entries dropped."""
    with open(_BURNERS + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(_BURNERS + ".json", encoding="utf-8") as fh:
                state = json.load(fh)
        except (OSError, ValueError):
            state = {}
        yield {"users": [p for p in state.get("users", []) if _alive(p)],
               "pids": [p for p in state.get("pids", []) if _alive(p)]}


def _shared_spinning(pids: List[int], timeout: float = 120.0) -> None:
    """Wait until every shared spinner has started its loop (its ready file), also ones another
    block started a moment ago, or has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(
            os.path.exists(f"{_BURNERS}.ready.{pid}") or not _alive(pid) for pid in pids):
        time.sleep(0.05)


def _save_burners(state: Dict[str, List[int]]) -> None:
    partial = f"{_BURNERS}.{os.getpid()}.json"
    with open(partial, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    os.replace(partial, _BURNERS + ".json")


def _alive(pid: int) -> bool:
    """Runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _tree(root: int) -> List[int]:
    """``root`` and its live descendants, from /proc."""
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return tree


def _pin_tree(root: int, cpus: Set[int]) -> Dict[int, Set[int]]:
    """Every thread of ``root`` and of its live descendants onto ``cpus`` (threads and processes
    they start later inherit it); each thread's affinity before, to put back."""
    before: Dict[int, Set[int]] = {}
    for pid in _tree(root):
        with contextlib.suppress(OSError):
            for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                with contextlib.suppress(OSError):
                    before[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, cpus)
    return before


@contextlib.contextmanager
def starved(root: int, spinners: int = 16, cpu: int = 0) -> Iterator[None]:
    """The job below ``root`` squeezed onto CPU ``cpu``, which ``spinners`` processes spin on,
    each in a session of its own: the scheduler shares a CPU between sessions (autogroup) or
    threads, so every rank of a job of a few ranks gets a few % of a core, runnable nearly all
    the time and waiting for the CPU. Affinities are put back when the block ends."""
    assert_alone("a starved CPU")
    procs: List[subprocess.Popen] = []
    before: Dict[int, Set[int]] = {}
    try:
        for _ in range(spinners):
            procs.append(_spawn(_BURN_ON, cpu, stdout=subprocess.PIPE))
        _spinning(procs)
        before = _pin_tree(root, {cpu})
        yield
    finally:
        for proc in procs:
            _stop(proc)
        for tid, cpus in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)


@contextlib.contextmanager
def _fifo(path: str) -> Iterator[str]:
    path = os.fspath(path)
    os.mkfifo(path)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def slow_reader(path: str, rate_bytes_per_s: float) -> Iterator[subprocess.Popen]:
    """A FIFO at ``path``, drained by a separate process at about ``rate_bytes_per_s`` until EOF.

    The reader opens the FIFO at once (blocking until the job opens it for writing); the job's
    writes then block whenever the 64 KiB pipe buffer is full, so a write of N bytes lasts about
    N / rate seconds. Yields the reader's Popen (its ``poll()`` is not None once it saw EOF).
    """
    with _fifo(path) as fifo:
        proc = _spawn(_READER, fifo, rate_bytes_per_s, _chunk_for(rate_bytes_per_s))
        try:
            yield proc
        finally:
            _stop(proc)


@contextlib.contextmanager
def slow_writer(path: str, total_bytes: int,
                rate_bytes_per_s: float) -> Iterator[subprocess.Popen]:
    """A FIFO at ``path``, fed ``total_bytes`` by a separate process at about
    ``rate_bytes_per_s``, then closed (the job's reader sees EOF). Yields the writer's Popen."""
    with _fifo(path) as fifo:
        proc = _spawn(_WRITER, fifo, rate_bytes_per_s, _chunk_for(rate_bytes_per_s),
                      int(total_bytes))
        try:
            yield proc
        finally:
            _stop(proc)


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A separate process listening on 127.0.0.1 that accepts and never answers; yields its port."""
    proc = _spawn(_SILENT_SERVER, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield port
    finally:
        _stop(proc)
        proc.stdout.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
