"""The job ``stalldoc attach`` is pointed at: from each pid given up to the job's top (its
launcher), the union of their trees, and the ranks in it (RANK in their environment, a
launcher's rank variable in a Python process's: SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK...,
or their place in Lightning's own launcher's tree: LOCAL_RANK, NODE_RANK, WORLD_SIZE).

From a pid, the climb goes up through its parents while they are part of the job: it stops below
init, a shell or terminal (bash, tmux, sshd, ...), a process of another user, and stalldoc's own
ancestors. The top is the highest launcher on the way (torchrun, deepspeed, accelerate, swift),
else the highest process reached (ranks a Python script started). Nothing here signals or
changes a process: it reads /proc.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import psutil

from stalldoc.errors import StalldocError
from stalldoc.run.job import JobTree, alive_process
from stalldoc.run.rundir import user_name
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.proc_table import ProcessTable, scan
from stalldoc.probes.command_line import is_launcher
from stalldoc.probes.process_tree import RankFinder, read_launch

EXIT_NOT_ATTACHABLE = 1
CLIMB_LIMIT = 64
# kernel names (at most 15 characters) of processes that hold a job without being part of it
NOT_THE_JOB = frozenset({
    "init", "systemd", "bash", "sh", "dash", "zsh", "fish", "ksh", "tcsh", "csh", "sshd",
    "sshd-session", "sudo", "su", "login", "tmux", "tmux: server", "tmux: client", "screen",
    "SCREEN", "tini", "dumb-init", "docker-init", "containerd-shim", "slurmstepd", "srun",
    "sbatch", "salloc", "cron", "script", "nohup", "setsid", "xargs", "make", "timeout",
    "code", "node", "supervisord", "runsv", "s6-supervise", "mosh-server"})
LAUNCHER_HINT = "give the launcher's pid (torchrun, deepspeed, accelerate, swift) or a rank's"


class NotAttachable(StalldocError):
    """A pid that is no job stalldoc can attach to (exit 1)."""

    exit_code = EXIT_NOT_ATTACHABLE


@dataclass(frozen=True)
class Target:
    """What attach found: the job's tops, its ranks, the first top's command line and start."""

    given: tuple[int, ...]
    roots: tuple[int, ...]
    ranks: tuple[RankProcess, ...]
    argv: tuple[str, ...]          # as read from /proc (the store redacts it)
    started_at: float              # when the first top started
    local_world_size: int | None   # LOCAL_WORLD_SIZE in a rank's environment, if any

    @property
    def missing(self) -> int:
        """Ranks the ranks' LOCAL_WORLD_SIZE promises on this machine that were not found."""
        return max(0, (self.local_world_size or 0) - len(self.ranks))


def find_target(pids: Sequence[int], me: int | None = None) -> Target:
    """The job of ``pids``; NotAttachable (one line) when a pid is none of a job's."""
    me = os.getpid() if me is None else me
    table = scan()
    mine = lineage(me, table)
    roots: list[int] = []
    for pid in dict.fromkeys(pids):
        check_pid(pid, table, mine, me)
        top = climb(pid, table, mine)
        if top not in roots:
            roots.append(top)
    roots = outermost(roots, table)
    tree = job_tree(roots, table, me)
    found = RankFinder().find(table, tree.pids(table, me), (), single=False, root=tree.roots)
    if not found.ranks:
        raise NotAttachable(no_ranks(roots, table, tree.pids(table, me)))
    launch = read_launch(roots[0])
    info = table.procs[roots[0]]
    return Target(tuple(dict.fromkeys(pids)), tuple(roots), found.ranks,
                  launch.cmdline if launch else (), info.started_at,
                  local_world_size(found.ranks[0].pid))


class AttachedTree(JobTree):
    """A job's tree that is not ours: its zombies are gone too (its launcher may have ended
    with no one reaping it yet: the job ended all the same)."""

    def descendants(self, exclude: int | None = None) -> list[psutil.Process]:
        return [proc for proc in super().descendants(exclude) if alive_process(proc)]


def job_tree(roots: Sequence[int], table: ProcessTable, me: int) -> AttachedTree:
    """The job's tree for the watcher: its tops, never stalldoc's own processes (``me`` is the
    reaper: its children, the py-spy dumps, are left out)."""
    tree = AttachedTree(roots[0], me)
    for pid in roots[1:]:
        info = table.get(pid)
        if info is not None:
            tree.add_root(pid, info.start_ticks)
    return tree


def lineage(pid: int, table: ProcessTable) -> set[int]:
    """``pid`` and its ancestors."""
    out: set[int] = set()
    while pid and pid not in out and len(out) < CLIMB_LIMIT:
        out.add(pid)
        pid = table.ppid(pid)
    return out


def check_pid(pid: int, table: ProcessTable, mine: set[int], me: int) -> None:
    """A live process that is not stalldoc's own lineage and whose ranks we may read."""
    info = table.get(pid)
    if info is None:
        raise NotAttachable(f"no process has pid {pid}")
    if info.dead:
        raise NotAttachable(f"pid {pid} ({info.name}) has ended; {LAUNCHER_HINT}")
    if pid in mine:
        what = "stalldoc itself" if pid == me else \
            "an ancestor of this stalldoc (init, a shell, a terminal)"
        raise NotAttachable(f"pid {pid} ({info.name}) is {what}, not a job; {LAUNCHER_HINT}")
    owner = owner_of(pid)
    if owner is not None and os.geteuid() not in (0, owner):
        raise NotAttachable(f"pid {pid} ({info.name}) belongs to {user_name(owner)}: only that "
                            f"user or root may read its ranks' environment and stacks; run "
                            f"stalldoc attach as {user_name(owner)}")


def owner_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def climb(pid: int, table: ProcessTable, mine: set[int]) -> int:
    """The top of ``pid``'s job: the highest launcher above it, else the highest process that
    is part of the job (see the module's docstring)."""
    chain, owner = [pid], owner_of(pid)
    parent = table.ppid(pid)
    while (parent > 1 and parent not in mine and len(chain) < CLIMB_LIMIT
           and parent in table and table.procs[parent].name not in NOT_THE_JOB
           and owner_of(parent) == owner):
        chain.append(parent)
        parent = table.ppid(parent)
    launchers = [p for p in chain if _launcher(p)]
    return launchers[-1] if launchers else chain[-1]


def _launcher(pid: int) -> bool:
    launch = read_launch(pid)
    return launch is not None and is_launcher(launch.cmdline)


def outermost(roots: list[int], table: ProcessTable) -> list[int]:
    """The roots that are not inside another root's tree (several pids of one job: one top)."""
    inside = {pid for root in roots for pid in table.subtree(root)}
    return [root for root in roots if root not in inside]


def no_ranks(roots: Sequence[int], table: ProcessTable, pids: Sequence[int]) -> str:
    """Why no rank was found: a job that is not distributed, or one whose ranks learn which
    they are only inside the process (mp.spawn, Ray), which attach cannot see."""
    names = ", ".join(f"{pid} ({table.procs[pid].name})" for pid in roots if pid in table)
    python = [p for p in pids if p in table and table.procs[p].name.startswith("python")]
    if len(python) > 1:
        return (f"no rank found under pid {names}: {len(python)} Python processes, none with "
                f"RANK or a launcher's rank variable (SLURM_PROCID, OMPI_COMM_WORLD_RANK, "
                f"PMI_RANK) in its environment; mp.spawn and Ray hand each rank its "
                f"number inside the process, which attach cannot read, and it does not guess; "
                f"start the job under `stalldoc watch -- ...` (its agent learns each rank when "
                f"it joins the process group)")
    return (f"no rank found under pid {names}: no process in its tree has RANK or a launcher's "
            f"rank variable in its environment (a job that is not distributed, or not started "
            f"yet); {LAUNCHER_HINT}")


def local_world_size(pid: int) -> int | None:
    try:
        value = psutil.Process(pid).environ().get("LOCAL_WORLD_SIZE")
    except psutil.Error:
        return None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
