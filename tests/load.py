"""Load and slow-storage helpers for tests (standard library only).

- ``cpu_burner(n)``: ``n`` separate Python processes spinning on a core each, for the duration of
  a ``with`` block (a loaded node).
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
import os
import socket
import subprocess
import sys
from typing import Dict, Iterator, List, Set

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


@contextlib.contextmanager
def cpu_burner(processes: int = 2) -> Iterator[List[subprocess.Popen]]:
    """``processes`` separate Python processes, each spinning on one core, while the block runs
    (it starts once they spin)."""
    procs: List[subprocess.Popen] = []
    try:
        for _ in range(processes):
            procs.append(_spawn(_BURN, stdout=subprocess.PIPE))
        _spinning(procs)
        yield procs
    finally:
        for proc in procs:
            _stop(proc)


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
