"""The kernel-wait probe on real processes blocked where jobs block: opening a checkpoint on a
file system that no longer answers (a FIFO nobody reads: the open never returns), reading a
reward server's answer that never comes, reading a pipe nobody writes, sleeping; a process on
the CPU is in no system call, and a process that is gone says nothing."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from stalldoc.model.kernel import KernelWait
from stalldoc.probes.kernel_wait import SYSCALLS, kernel_wait

pytestmark = pytest.mark.skipif(not SYSCALLS or not os.path.exists("/proc/self/syscall"),
                                reason="needs Linux's /proc/PID/syscall on x86_64 or aarch64")


def _blocked(proc: subprocess.Popen, timeout: float = 20.0) -> KernelWait:
    """The process's wait once it sits in a system call (it starts on the CPU, importing)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        wait = kernel_wait(proc.pid)
        if wait is not None and wait.call not in ("wait4", "waitid", "execve"):
            return wait
        time.sleep(0.1)
    raise AssertionError(f"pid {proc.pid} never blocked in a system call")


@contextlib.contextmanager
def _python(code: str, *args: str, **popen) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], **popen)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _settled(proc: subprocess.Popen, call: str) -> KernelWait:
    """The wait once it is ``call`` (a process goes through others on its way there)."""
    deadline = time.time() + 20.0
    wait = _blocked(proc)
    while wait.call != call and time.time() < deadline:
        time.sleep(0.1)
        wait = _blocked(proc)
    return wait


def test_a_checkpoint_open_that_never_returns_names_the_call_and_the_path(tmp_path: Path):
    # GIVEN a process saving to a path whose open never returns (a FIFO nobody reads)
    path = tmp_path / "mnt" / "ckpt" / "step_100.pt"
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    with _python("import sys; open(sys.argv[1], 'wb')", str(path)) as proc:
        wait = _settled(proc, "openat")
        # THEN it is blocked in openat of that path: I/O, said with the path
        assert (wait.call, wait.target, wait.io) == ("openat", str(path), True), wait
        assert wait.words().startswith(f"blocked in openat({path})"), wait.words()
        assert wait.state == "S"


def test_a_read_from_a_server_that_never_answers_names_the_connection() -> None:
    # GIVEN a server that accepts and never answers, and a client waiting for its answer
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = ("import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))"
                "; s.sendall(b'score'); s.recv(4096)")
        with _python(code, str(port)) as proc:
            wait = _settled(proc, "recvfrom")
            # THEN it is blocked receiving on that TCP connection
            assert (wait.call, wait.target) == ("recvfrom", f"TCP to 127.0.0.1:{port}"), wait
            assert wait.io and f"recvfrom(TCP to 127.0.0.1:{port})" in wait.words()


def test_a_read_of_a_pipe_nobody_writes_names_the_pipe() -> None:
    with _python("import sys; sys.stdin.buffer.read(1)", stdin=subprocess.PIPE) as proc:
        wait = _settled(proc, "read")
        assert (wait.call, wait.target, wait.io) == ("read", "a pipe", True), wait


def test_a_sleep_is_no_io_and_a_process_on_the_cpu_is_in_no_call() -> None:
    with _python("import time; time.sleep(60)") as proc:
        wait = _blocked(proc)
        assert wait.call in ("clock_nanosleep", "nanosleep", "select", "pselect6"), wait
        assert not wait.io
    with _python("while True: pass") as proc:
        time.sleep(1.0)   # past its start (imports read files)
        assert kernel_wait(proc.pid) is None


def test_a_process_that_is_gone_says_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert kernel_wait(proc.pid) is None


def test_the_words_say_the_kernel_wait_and_an_uninterruptible_state() -> None:
    hung = KernelWait("newfstatat", "/mnt/nfs/data", "rpc_wait_bit_killable", "D")
    assert hung.words() == ("blocked in newfstatat(/mnt/nfs/data) (kernel: rpc_wait_bit_killable, "
                            "uninterruptible (D))")
    assert hung.io
    assert KernelWait("futex", state="D").io   # uninterruptible: I/O whatever the call
    assert not KernelWait("futex", wchan="futex_wait_queue").io
    assert KernelWait("syscall 999").words() == "blocked in syscall 999"
