"""Find the ranks among the job's processes and tell them from launchers and forked workers."""
from __future__ import annotations

import os
from typing import Iterable

import psutil

from stalldoc.model import RankProcess

_MP_MARKERS = ("multiprocessing", "resource_tracker", "forkserver")
# Launchers start the ranks; before their children exist they must not pass for a single rank.
_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun", "deepspeed",
              "accelerate", "swift/cli/main", "bin/swift")


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _cmdline(proc: psutil.Process) -> tuple[str, ...]:
    try:
        return tuple(proc.cmdline())
    except psutil.Error:
        return ()


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except psutil.Error:
        return None


def _is_python(proc: psutil.Process, agent_pids: set[int]) -> bool:
    if proc.pid in agent_pids:
        return True
    try:
        return os.path.basename(proc.name()).startswith("python")
    except psutil.Error:
        return False


def find_ranks(procs: Iterable[psutil.Process], agent_pids: set[int] = frozenset(),
               single: bool = True, root: int | None = None) -> list[RankProcess]:
    """Ranks: processes with RANK in their environment whose parent is not the same rank.

    A child with its parent's RANK is that rank's worker (dataloader, dataset.map pool). A
    process outside the job's tree other than its ``root`` (a worker orphaned by its dead rank
    and re-parented to the watcher) is not a rank either. With no RANK anywhere, the job is a
    single process: the deepest Python process that is neither a fork of its parent nor a
    multiprocessing helper is rank 0.
    """
    procs = list(procs)
    by_pid = {p.pid: p for p in procs}
    envs = {p.pid: _environ(p) for p in procs}
    ranks = []
    for proc in procs:
        rank = _int(envs[proc.pid].get("RANK"))
        if rank is None:
            continue
        parent = _ppid(proc)
        if parent in envs and _int(envs[parent].get("RANK")) == rank:
            continue
        if parent in envs and not envs[parent]:
            continue   # its parent is dying (a zombie): a worker about to be orphaned
        if root is not None and proc.pid != root and parent not in envs:
            continue   # orphaned: its parent left the job
        ranks.append(RankProcess(rank, proc.pid, _int(envs[proc.pid].get("LOCAL_RANK")),
                                 _cmdline(proc)))
    if ranks or not single:
        return sorted(ranks, key=lambda r: (r.rank, r.pid))
    single = _single_process(procs, by_pid, agent_pids)
    return [RankProcess(0, single.pid, None, _cmdline(single), False)] if single else []


def _depth(proc: psutil.Process, by_pid: dict[int, psutil.Process]) -> int:
    depth, pid = 0, _ppid(proc)
    while pid in by_pid:
        depth, pid = depth + 1, _ppid(by_pid[pid])
    return depth


def _single_process(procs: list[psutil.Process], by_pid: dict[int, psutil.Process],
                    agent_pids: set[int]) -> psutil.Process | None:
    candidates = []
    for proc in procs:
        cmd = _cmdline(proc)
        parent = by_pid.get(_ppid(proc) or -1)
        forked = parent is not None and _cmdline(parent) == cmd
        text = " ".join(cmd)
        helper = any(m in text for m in _MP_MARKERS + _LAUNCHERS)
        if _is_python(proc, agent_pids) and not forked and not helper:
            candidates.append(proc)
    if not candidates:  # a job of no Python process: the command itself, unless a launcher
        root = procs[0] if procs else None
        launcher = root is not None and any(m in " ".join(_cmdline(root)) for m in _LAUNCHERS)
        return None if launcher else root
    return max(candidates, key=lambda p: (_depth(p, by_pid), -p.pid))
