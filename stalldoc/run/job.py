"""The watched command, as the relay sees it: spawned in its own process group (in the caller's
session, so the terminal stays its own), its process tree, and ending that tree on request."""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

from stalldoc.errors import CommandNotExecutable, CommandNotFound
from stalldoc.probes.proc_table import ProcessTable, scan

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


def become_subreaper() -> None:
    """Orphaned ranks (their launcher died) are re-parented to us, so they stay in our tree."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Job:
    """One running command. The relay reaps it (``waitpid``); nothing here waits on it."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: int, stderr: int) -> None:
        executable = resolve_command(argv)
        try:
            proc = subprocess.Popen([executable, *argv[1:]], env=env, stdout=stdout,
                                    stderr=stderr, process_group=0)
        except PermissionError as exc:
            raise CommandNotExecutable(argv[0]) from exc
        except OSError as exc:  # e.g. exec format error
            raise CommandNotExecutable(f"{argv[0]} ({exc.strerror})") from exc
        proc.returncode = 0   # reaped by the relay's waitpid(-1): Popen must never wait on it
        self.pid = proc.pid
        self.started_at = time.time()
        self.tree = JobTree(self.pid, os.getpid())

    def descendants(self, exclude: int | None = None) -> list[psutil.Process]:
        return self.tree.descendants(exclude)

    def signal_group(self, signum: int) -> None:
        """A signal to the job's process group, as a terminal or a launcher would send it."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class JobTree:
    """The processes of a job: the command, all below it, and the orphans re-parented to the
    relay (its subreaper), except a process named by the caller and its own tree."""

    def __init__(self, pid: int, reaper: int) -> None:
        self.pid = pid
        self.reaper = reaper
        self.known: dict[int, int | None] = {pid: None}   # pid -> its start (clock ticks)
        self.roots: tuple[int, ...] = (pid,)   # the command, and more tops (``add_root``)

    def add_root(self, pid: int, start_ticks: int) -> None:
        """One more top of the job, with its tree (``stalldoc attach`` given several pids)."""
        if pid not in self.roots:
            self.roots += (pid,)
            self.known[pid] = start_ticks

    def pids(self, table: ProcessTable, exclude: int | None = None) -> list[int]:
        """The job's processes in ``table``, its command first; a process once seen stays in the
        job after its parent died, until it ends (a new process reusing its pid is not kept)."""
        skip = {exclude, *table.subtree(exclude), self.reaper} if exclude else {self.reaper}
        found: dict[int, None] = {}
        first = self._first_start(table)
        orphans = sorted((pid for pid in set(table.children.get(self.reaper, ())) - skip
                          # one started before the job is none of its orphans
                          if first is None or table.procs[pid].start_ticks >= first),
                         key=lambda pid: (table.procs[pid].start_ticks, pid))  # the oldest first
        for pid in [self.pid, *sorted(self.known), *orphans]:
            if pid in found or not self._alive(table, pid):
                continue   # found: its tree is in already
            found[pid] = None
            for child in table.subtree(pid):
                found.setdefault(child)
        for pid in found:
            if pid not in skip:
                self.known[pid] = table.procs[pid].start_ticks
        return [pid for pid in found if pid not in skip]

    def _first_start(self, table: ProcessTable) -> int | None:
        """When the job's first top started (clock ticks); None while none was seen."""
        starts = [self.known.get(root) or (table.procs[root].start_ticks
                                           if root in table.procs else None)
                  for root in self.roots]
        return min((s for s in starts if s is not None), default=None)

    def _alive(self, table: ProcessTable, pid: int) -> bool:
        info = table.get(pid)
        start = self.known.get(pid)
        if info is None or (start is not None and info.start_ticks != start):
            self.known.pop(pid, None)
            return False
        return True

    def descendants(self, exclude: int | None = None) -> list[psutil.Process]:
        """The job's processes now, as psutil processes (to signal them)."""
        procs = []
        for pid in self.pids(scan(), exclude):
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                continue
        return procs


class Ending:
    """Ending a set of processes without blocking: SIGTERM now, SIGKILL to what is still alive
    once ``grace`` seconds have passed (``due``)."""

    def __init__(self, procs: list[psutil.Process], grace: float) -> None:
        self.procs = procs
        self.deadline = time.time() + grace
        self.killed = False
        for proc in procs:
            send(proc, signal.SIGTERM)

    def due(self, now: float) -> bool:
        """SIGKILL the survivors once the grace is over; True while any is still alive."""
        alive = [p for p in self.procs if alive_process(p)]
        if alive and now >= self.deadline and not self.killed:
            for proc in alive:
                send(proc, signal.SIGKILL)
            self.killed = True
        return bool(alive)


def send(proc: psutil.Process, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except psutil.Error:
        pass


def alive_process(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
