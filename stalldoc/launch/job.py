"""The watched command: started in its own process group, its output teed line by line, signals
forwarded, the whole tree ended on request, and its exit code kept."""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable

import psutil

from stalldoc.errors import CommandNotExecutable, CommandNotFound
from stalldoc.model import LogLine

_PR_SET_CHILD_SUBREAPER = 36


def resolve_command(argv: list[str]) -> str:
    """The executable path of ``argv[0]``, or a CommandNotFound / CommandNotExecutable error."""
    name = argv[0]
    if os.sep in name:
        if not os.path.exists(name):
            raise CommandNotFound(name)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise CommandNotExecutable(name)
        return name
    found = shutil.which(name)
    if found is None:
        raise CommandNotFound(name)
    return found


def exit_status(returncode: int) -> int:
    """The shell's convention: 128+N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def become_subreaper() -> None:
    """Orphaned ranks (their launcher died) are re-parented to us, so they stay in our tree."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Job:
    """One running command and what it printed."""

    def __init__(self, argv: list[str], env: dict[str, str], on_line: Callable[[LogLine], None],
                 write: Callable[[BinaryIO, bytes], None] | None = None) -> None:
        executable = resolve_command(argv)
        try:
            self.proc = subprocess.Popen([executable, *argv[1:]], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except PermissionError as exc:
            raise CommandNotExecutable(argv[0]) from exc
        except OSError as exc:  # e.g. exec format error
            raise CommandNotExecutable(f"{argv[0]} ({exc.strerror})") from exc
        self.pid = self.proc.pid
        self.started_at = time.time()
        self.known: set[int] = {self.pid}
        self._on_line = on_line
        self._write = write or _write_through
        self._pumps = [self._pump(self.proc.stdout, sys.stdout.buffer, "stdout"),
                       self._pump(self.proc.stderr, sys.stderr.buffer, "stderr")]

    def _pump(self, source: BinaryIO | None, sink: BinaryIO, stream: str) -> threading.Thread:
        thread = threading.Thread(target=self._copy, args=(source, sink, stream), daemon=True,
                                  name=f"stalldoc-{stream}")
        thread.start()
        return thread

    def _copy(self, source: BinaryIO | None, sink: BinaryIO, stream: str) -> None:
        assert source is not None
        pending = b""
        while chunk := os.read(source.fileno(), 65536):
            self._write(sink, chunk)
            pending += chunk
            *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
            for raw in lines:
                if raw:
                    self._on_line(LogLine(time.time(), stream, raw.decode("utf-8", "replace")))
        if pending:
            self._on_line(LogLine(time.time(), stream, pending.decode("utf-8", "replace")))

    def descendants(self) -> list[psutil.Process]:
        """Every live process of the job: the command and all below it (re-parented ones too)."""
        found: dict[int, psutil.Process] = {}
        for pid in [self.pid, *sorted(self.known)]:
            try:
                root = psutil.Process(pid)
                found.setdefault(pid, root)
                for child in root.children(recursive=True):
                    found.setdefault(child.pid, child)
            except psutil.Error:
                continue
        self.known.update(found)
        return list(found.values())

    def poll(self) -> int | None:
        self.reap_orphans()
        return self.proc.poll()

    def reap_orphans(self) -> None:
        """Collect job processes re-parented to us that have exited (we are their subreaper)."""
        me = os.getpid()
        for pid in list(self.known - {self.pid}):
            try:
                if psutil.Process(pid).ppid() == me:
                    os.waitpid(pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                self.known.discard(pid)

    def forward(self, signum: int) -> None:
        """Pass a signal on to the job's process group (launchers pass it to their ranks)."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def terminate_tree(self, grace: float) -> None:
        """SIGTERM every job process, then SIGKILL what is still alive after ``grace`` seconds."""
        procs = self.descendants()
        for proc in procs:
            _send(proc, signal.SIGTERM)
        deadline = time.time() + grace
        others = [p for p in procs if p.pid != self.pid]
        while time.time() < deadline:
            # the main child is waited for by Popen only: psutil would reap it and lose its status
            others = [p for p in others if _alive(p)]
            if self.proc.poll() is not None and not others:
                return
            time.sleep(0.05)
        for proc in self.descendants():
            _send(proc, signal.SIGKILL)

    def wait(self) -> int:
        """Wait for the command to end and its output to drain; return its exit status."""
        returncode = self.proc.wait()
        for pump in self._pumps:
            pump.join(timeout=5)
        return exit_status(returncode)


def _send(proc: psutil.Process, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except psutil.Error:
        pass


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _write_through(sink: BinaryIO, data: bytes) -> None:
    try:
        sink.write(data)
        sink.flush()
    except (OSError, ValueError):
        pass  # our own stdout went away: keep draining so the job never blocks on a full pipe
