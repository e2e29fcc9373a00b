"""Find the ranks among the job's processes and tell them from launchers and forked workers."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Sequence, TypeVar

import psutil

from stalldoc.model import RankProcess
from stalldoc.probes.proc_table import ProcessTable, ProcInfo

_MP_MARKERS = ("multiprocessing", "resource_tracker", "forkserver")
# Launchers start the ranks; before their children exist they must not pass for a single rank.
_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun", "deepspeed",
              "accelerate", "swift/cli/main", "bin/swift")
T = TypeVar("T")


def is_launcher(cmdline: Sequence[str]) -> bool:
    """A launcher's command line (torchrun, deepspeed, accelerate, swift): it starts ranks."""
    joined = " ".join(cmdline)
    return any(marker in joined for marker in _LAUNCHERS)


RANK_LIMIT = 2**31     # RANK and LOCAL_RANK are numbers from 0 up to this, excluded


@dataclass(frozen=True)
class Launch:
    """What a process was started with, read once: its rank variables and its command line."""

    rank: int | None
    local_rank: int | None
    bad: int                   # RANK / LOCAL_RANK values that are not a rank number
    environment: bool          # its environment was readable and not empty
    cmdline: tuple[str, ...]


NOTHING = Launch(None, None, 0, False, ())   # a zombie's, or an ended process's


@dataclass(frozen=True)
class Found:
    """The ranks among the job's processes at one tick."""

    ranks: tuple[RankProcess, ...]
    skipped: int = 0           # processes whose RANK or LOCAL_RANK is not a rank number


def rank_number(value: str | None) -> tuple[int | None, int]:
    """(the number, 0) for a RANK-like value, (None, 0) when absent, (None, 1) when it is not a
    rank: not an integer, negative, or from 2**31 on (beyond any job, and SQLite's integers)."""
    if value is None:
        return None, 0
    try:
        number = int(value)
    except ValueError:    # not a number, or too long to be one
        return None, 1
    return (number, 0) if 0 <= number < RANK_LIMIT else (None, 1)


def read_launch(pid: int) -> Launch | None:
    """A process's rank variables and command line; None when it ended meanwhile."""
    try:
        proc = psutil.Process(pid)
        environ = _or_empty(proc.environ, {})
        cmdline = tuple(_or_empty(proc.cmdline, []))
    except psutil.NoSuchProcess:
        return None
    rank, bad_rank = rank_number(environ.get("RANK"))
    local_rank, bad_local = rank_number(environ.get("LOCAL_RANK"))
    return Launch(rank, local_rank, bad_rank + bad_local, bool(environ), cmdline)


def _or_empty(read: Callable[[], T], empty: T) -> T:
    """What ``read`` returns; ``empty`` where the kernel refuses (another user's process)."""
    try:
        return read()
    except psutil.AccessDenied:
        return empty


class RankFinder:
    """Finds the ranks each tick in a snapshot of the process table. A process's environment and
    command line are read once: again only for a new process (a reused pid) or after an exec."""

    def __init__(self) -> None:
        self._launches: dict[tuple[int, int, tuple[int, ...]], Launch] = {}

    def find(self, table: ProcessTable, pids: Sequence[int], agent_pids: Iterable[int] = (),
             single: bool = True, root: int | Collection[int] | None = None) -> Found:
        """Ranks: processes with RANK in their environment whose parent is not the same rank.

        A child with its parent's RANK is that rank's worker (dataloader, dataset.map pool). A
        process outside the job's tree other than its ``root`` (a worker orphaned by its dead
        rank and re-parented to the watcher) is not a rank either; ``root`` may be several pids
        (the tops of a job ``stalldoc attach`` was given). With no RANK anywhere, the job
        is a single process: the deepest Python process that is neither a fork of its parent nor
        a multiprocessing helper is rank 0. ``pids`` are the job's processes, its command first;
        one whose RANK or LOCAL_RANK is not a rank number is counted in ``skipped``.
        """
        pids = [pid for pid in pids if pid in table]
        roots = None if root is None else frozenset([root] if isinstance(root, int) else root)
        launches = {pid: self._launch(table.procs[pid]) for pid in pids}
        self._forget({table.procs[pid].identity for pid in pids})
        ranks = [rank for pid in pids
                 if (rank := _rank(pid, launches, table.ppid(pid), roots)) is not None]
        skipped = sum(launch.bad for launch in launches.values())
        if ranks or not single:
            return Found(tuple(sorted(ranks, key=lambda r: (r.rank, r.pid))), skipped)
        chosen = _single_process(table, pids, launches, set(agent_pids))
        return Found(() if chosen is None else
                     (RankProcess(0, chosen, None, launches[chosen].cmdline, False),), skipped)

    def _launch(self, info: ProcInfo) -> Launch:
        if info.dead:
            return NOTHING
        launch = self._launches.get(info.identity)
        if launch is None:
            launch = read_launch(info.pid)
            if launch is None:
                return NOTHING
            self._launches[info.identity] = launch
        return launch

    def _forget(self, current: set[tuple[int, int, tuple[int, ...]]]) -> None:
        for identity in [i for i in self._launches if i not in current]:
            del self._launches[identity]


def _rank(pid: int, launches: dict[int, Launch], parent: int,
          roots: frozenset[int] | None) -> RankProcess | None:
    launch = launches[pid]
    if launch.rank is None:
        return None
    above = launches.get(parent)
    if above is not None and above.rank == launch.rank:
        return None   # its rank's worker
    if above is not None and not above.environment:
        return None   # its parent is dying (a zombie): a worker about to be orphaned
    if roots is not None and pid not in roots and above is None:
        return None   # orphaned: its parent left the job
    return RankProcess(launch.rank, pid, launch.local_rank, launch.cmdline)


def _is_python(info: ProcInfo, agent_pids: set[int]) -> bool:
    return info.pid in agent_pids or os.path.basename(info.name).startswith("python")


def _depth(pid: int, table: ProcessTable, launches: dict[int, Launch]) -> int:
    depth, pid = 0, table.ppid(pid)
    while pid in launches and depth < len(launches):   # a table read in passes may loop
        depth, pid = depth + 1, table.ppid(pid)
    return depth


def _single_process(table: ProcessTable, pids: list[int], launches: dict[int, Launch],
                    agent_pids: set[int]) -> int | None:
    candidates = []
    for pid in pids:
        cmd = launches[pid].cmdline
        parent = launches.get(table.ppid(pid))
        forked = parent is not None and parent.cmdline == cmd
        helper = any(m in " ".join(cmd) for m in _MP_MARKERS + _LAUNCHERS)
        if _is_python(table.procs[pid], agent_pids) and not forked and not helper:
            candidates.append(pid)
    if not candidates:  # a job of no Python process: the command itself, unless a launcher
        root = pids[0] if pids else None
        launcher = root is not None and any(m in " ".join(launches[root].cmdline)
                                            for m in _LAUNCHERS)
        return None if launcher else root
    return max(candidates, key=lambda pid: (_depth(pid, table, launches), -pid))
