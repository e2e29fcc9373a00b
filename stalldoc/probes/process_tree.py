"""Find the ranks among the job's processes and tell them from launchers and forked workers."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Mapping, Sequence, TypeVar

import psutil

from stalldoc.agent import identity
from stalldoc.agent.statefile import CLAIM_SOURCES
from stalldoc.model.ranks import CLAIM_STRENGTH, EngineProcess, RankClaim, RankProcess
from stalldoc.probes.command_line import is_launcher, is_runner
from stalldoc.probes.engines import engine_claims, engine_pids, engine_processes
from stalldoc.probes.proc_table import ProcessTable, ProcInfo

_MP_MARKERS = ("multiprocessing", "resource_tracker", "forkserver")
# Ray's own processes (raylet, GCS, dashboard and its agents, monitors, idle pooled workers)
_RAY_MARKERS = ("ray/_private/", "ray/dashboard/", "ray/autoscaler/", "/raylet", "gcs_server",
                "ray::", "ray/util/client/server", "ray.util.client.server",
                "ray/_private/runtime_env/agent")
_RAY_NODE = ("/raylet", "gcs_server")   # a Ray node's own processes: a driver started them
T = TypeVar("T")


RANK_LIMIT = 2**31     # RANK and LOCAL_RANK are numbers from 0 up to this, excluded


@dataclass(frozen=True)
class Launch:
    """What a process was started with, read once: its rank variables and its command line."""

    rank: int | None
    local_rank: int | None
    bad: int                   # RANK / LOCAL_RANK values that are not a rank number
    environment: bool          # its environment was readable and not empty
    cmdline: tuple[str, ...]
    # its launcher's rank variable (SLURM_PROCID, OMPI_COMM_WORLD_RANK, ...): a Python
    # process's claim where no agent in it makes one (``stalldoc attach``, ``python -I``)
    launcher_claim: RankClaim | None = None
    # (LOCAL_RANK, NODE_RANK, WORLD_SIZE) as Lightning's launcher hands them to the processes it
    # starts (no RANK); the global rank needs its parent's tree too (``_lightning_claims``)
    lightning: tuple[int, int, int] | None = None


NOTHING = Launch(None, None, 0, False, ())   # a zombie's, or an ended process's


@dataclass(frozen=True)
class Found:
    """The ranks among the job's processes at one tick."""

    ranks: tuple[RankProcess, ...]
    skipped: int = 0           # processes whose RANK or LOCAL_RANK is not a rank number
    engines: tuple[EngineProcess, ...] = ()   # vLLM engines' processes: the ranks' work


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
    return Launch(rank, local_rank, bad_rank + bad_local, bool(environ), cmdline,
                  launcher_claim(environ), lightning_vars(environ))


def lightning_vars(environ: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(LOCAL_RANK, NODE_RANK, WORLD_SIZE) of a process Lightning's launcher started: all three
    and MASTER_PORT set, RANK not (its launcher sets no RANK); None otherwise."""
    if "RANK" in environ or "MASTER_PORT" not in environ:
        return None
    values = [rank_number(environ.get(name))[0] for name in ("LOCAL_RANK", "NODE_RANK",
                                                             "WORLD_SIZE")]
    if any(v is None for v in values) or values[0] < 1 or values[2] < 2:
        return None
    return values[0], values[1], values[2]


def launcher_claim(environ: Mapping[str, str]) -> RankClaim | None:
    """The claim a launcher's variables make (Slurm, Open MPI, PMIx, PMI, MVAPICH) when RANK is
    absent: the one the agent makes at start (``agent/identity.py``)."""
    source, rank, local, size, _ = identity.from_environment(environ)
    name = CLAIM_SOURCES[source]
    if rank < 0 or name == "RANK":
        return None
    return RankClaim(name, rank, local if local >= 0 else None, size if size > 0 else None)


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
        self._numbers = Numbers()
        self._drivers: set[tuple[int, int]] = set()   # (pid, start) of Ray drivers seen

    def find(self, table: ProcessTable, pids: Sequence[int], agent_pids: Iterable[int] = (),
             single: bool = True, root: int | Collection[int] | None = None,
             claims: Mapping[int, RankClaim] | None = None,
             ray_drivers: Iterable[int] = ()) -> Found:
        """Ranks: processes that claim a rank and are not another rank's worker or a launcher.

        A process claims a rank through its agent (``claims``: the process group it created,
        RANK, or a launcher's variable such as SLURM_PROCID; ``agent/identity.py``) or by RANK
        in its environment. A process whose nearest claiming ancestor claims the same rank at
        least as strongly is that rank's worker (dataloader, dataset.map pool). A process that
        claims only by a launcher's variable is a launcher when it is one by its command line or
        when a process below it claims by RANK or its process group (mp.spawn's parent in a
        Slurm step) or when it started a Ray node (a Ray driver: Ray's workers are the ranks).
        Ray's own processes never are ranks, and a Ray worker is one only once it joined a
        process group (verl hands ranks over as RANK in ``env_vars``; Ray starts spare workers
        with them now and then, and ends them). A process outside the job's tree other
        than its ``root`` (orphaned by its dead rank) is not a rank either; ``root`` may be
        several pids (the tops of a job ``stalldoc attach`` was given). With no claim anywhere,
        the job is a single process: the outermost Python process that is neither a fork of
        its parent nor a helper (a launcher, ``conda run``) is rank 0, the user's program under
        any shell or runner (the Python processes it starts, a server, a compile worker, a
        detached child, are its work, never it), unless a process of the job started a Ray
        node (now or before): then its Python processes are Ray's, its workers or their driver,
        and no process is guessed. ``pids`` are the job's processes, its command first; one
        whose RANK or LOCAL_RANK is not a rank number is counted in ``skipped``. When ranks of
        several worlds are found, their ranks are numbered apart (``Numbers``).
        """
        pids = [pid for pid in pids if pid in table]
        roots = None if root is None else frozenset([root] if isinstance(root, int) else root)
        launches = {pid: self._launch(table.procs[pid]) for pid in pids}
        self._forget({table.procs[pid].identity for pid in pids})
        with_agent = set(agent_pids)
        python = {pid for pid in pids if _is_python(table.procs[pid], with_agent)}
        claimed = _claims(pids, launches, claims or {}, python,
                          _lightning_claims(pids, launches, table))
        workers = engine_claims(claimed)
        claimed = {pid: claim for pid, claim in claimed.items() if pid not in workers}
        drivers = self._ray_drivers(table, pids, launches, ray_drivers)
        ranks = self._numbers.number(_ranks(pids, claimed, launches, table, roots, drivers),
                                     table)
        skipped = sum(launch.bad for launch in launches.values())
        if not ranks and single:
            engine = engine_pids(workers, pids, table)
            chosen = _single_process(table, [p for p in pids if p not in engine], launches,
                                     with_agent, drivers, roots)
            ranks = [] if chosen is None else [
                RankProcess(0, chosen, None, launches[chosen].cmdline, False, "")]
        ranks = sorted(ranks, key=lambda r: (r.rank, r.pid))
        engines = engine_processes(workers, pids, table, {r.pid: r.rank for r in ranks})
        return Found(tuple(ranks), skipped, engines)

    def _ray_drivers(self, table: ProcessTable, pids: Sequence[int],
                     launches: Mapping[int, Launch], said: Iterable[int] = ()) -> set[int]:
        """The job's processes that started a Ray node, or that Ray says are a job's driver
        (``said``: a driver that joined a cluster started apart starts no node), now or before
        (a driver after ``ray.shutdown()`` is still no rank)."""
        alive = {_process(table.procs[pid]) for pid in pids}
        now = {_process(table.procs[pid]) for pid in _ray_drivers(table, pids, launches)
               | (set(said) & set(pids))}
        self._drivers = (self._drivers & alive) | now
        return {pid for pid in pids if _process(table.procs[pid]) in self._drivers}

    def _launch(self, info: ProcInfo) -> Launch:
        if info.dead:
            return NOTHING
        launch = self._launches.get(info.identity)
        if launch is None and info.released:
            launch = self._before_exit(info)
        if launch is None:
            launch = read_launch(info.pid)
            if launch is None:
                return NOTHING
        self._launches[info.identity] = launch
        return launch

    def _before_exit(self, info: ProcInfo) -> Launch | None:
        """What a process in its exit was launched as: its memory released, the kernel shows
        no argv addresses (a new identity) and an empty command line, while it is no zombie yet
        (a large process takes a while to free its memory). Read fresh, the single process of
        a job would be no candidate for its rank 0 in that moment and be dropped as "not rank
        0" as it exits cleanly."""
        return next((launch for (pid, start, _), launch in self._launches.items()
                     if pid == info.pid and start == info.start_ticks), None)

    def _forget(self, current: set[tuple[int, int, tuple[int, ...]]]) -> None:
        for identity in [i for i in self._launches if i not in current]:
            del self._launches[identity]


def _claims(pids: Sequence[int], launches: Mapping[int, Launch],
            agents: Mapping[int, RankClaim], python: set[int],
            lightning: Mapping[int, RankClaim]) -> dict[int, RankClaim]:
    """Each process's strongest claim: its agent's, or RANK in its environment, or its place in
    a Lightning launcher's tree, or (``python`` processes only: a shell inherits its task's
    variables) a launcher's variable."""
    out = {}
    for pid in pids:
        launch, agent = launches[pid], agents.get(pid)
        inherited = lightning.get(pid) or (launch.launcher_claim if pid in python else None)
        env = (inherited if launch.rank is None else
               RankClaim("RANK", launch.rank, launch.local_rank))
        best = agent if env is None or (agent is not None and agent.strength >= env.strength) \
            else env
        if best is not None:
            out[pid] = best
    return out


def _lightning_claims(pids: Sequence[int], launches: Mapping[int, Launch],
                      table: ProcessTable) -> dict[int, RankClaim]:
    """The ranks of Lightning's own launcher (``Trainer(strategy="ddp")`` started as ``python
    train.py``): the process the user started is local rank 0 and starts local ranks 1..n-1 as
    copies of its own command line with LOCAL_RANK, NODE_RANK and WORLD_SIZE (no RANK); each
    one's global rank is NODE_RANK * n + LOCAL_RANK, as Lightning computes it. Only a complete
    tree claims: local ranks exactly 1..n-1 with one NODE_RANK and WORLD_SIZE that n divides
    (not all started yet, or another layout: no claim, no guess)."""
    trees: dict[int, list[int]] = {}
    for pid in pids:
        launch, parent = launches[pid], table.ppid(pid)
        above = launches.get(parent)
        if (launch.lightning is not None and above is not None and above.rank is None
                and above.lightning is None and above.cmdline == launch.cmdline):
            trees.setdefault(parent, []).append(pid)
    out: dict[int, RankClaim] = {}
    for parent, children in trees.items():
        seen = {launches[c].lightning for c in children}
        n = len(children) + 1
        node, world = launches[children[0]].lightning[1:]
        if (sorted(s[0] for s in seen) != list(range(1, n)) or {s[1:] for s in seen} != {
                (node, world)} or world % n or node >= world // n):
            continue
        out[parent] = RankClaim("Lightning", node * n, 0, world)
        for child in children:
            local = launches[child].lightning[0]
            out[child] = RankClaim("Lightning", node * n + local, local, world)
    return out


def _ranks(pids: Sequence[int], claimed: Mapping[int, RankClaim], launches: Mapping[int, Launch],
           table: ProcessTable, roots: frozenset[int] | None, drivers: set[int]
           ) -> list[RankProcess]:
    starts = _ancestors(pids, [p for p, c in claimed.items() if c.strength >= 2], table)
    starts |= drivers
    ranks = []
    for pid, claim in claimed.items():
        launch = launches[pid]
        if claim.strength < 2 and (pid in starts or _helper(launch.cmdline)):
            continue   # a launcher (or Ray's) that only inherited a launcher's variable
        if claim.strength < 3 and task_executor(launch.cmdline):
            continue   # a Ray worker given a rank's env_vars: Ray may start spares and end them
        above = launches.get(table.ppid(pid))
        if above is not None and not above.environment:
            continue   # its parent is dying (a zombie): a worker about to be orphaned
        if roots is not None and pid not in roots and above is None:
            continue   # orphaned: its parent left the job
        holder = _claiming_ancestor(pid, claimed, table)
        if holder is not None and _same_rank(claim, holder):
            continue   # its rank's worker
        ranks.append(RankProcess(claim.rank, pid, claim.local_rank, launch.cmdline, True,
                                 claim.source, claim.world))
    return ranks


def task_executor(cmdline: Sequence[str]) -> bool:
    """A Ray worker process: it runs tasks its driver hands it, and idles between them."""
    joined = " ".join(cmdline)
    return "ray/_private/workers/" in joined or joined.startswith("ray::")


def _helper(cmdline: Sequence[str]) -> bool:
    """A launcher (also of an environment: ``conda run``), a multiprocessing helper or one of
    Ray's processes, by its command line. Launchers start the ranks; before their children
    exist they must not pass for a single rank."""
    joined = " ".join(cmdline)
    return (is_launcher(cmdline) or is_runner(cmdline)
            or any(m in joined for m in _MP_MARKERS + _RAY_MARKERS))


def _same_rank(claim: RankClaim, holder: RankClaim) -> bool:
    """``claim`` repeats ``holder``'s: a worker that inherited its rank's environment."""
    return (claim.rank == holder.rank and claim.strength <= holder.strength
            and (claim.world == holder.world or claim.strength < 3))


def _claiming_ancestor(pid: int, claimed: Mapping[int, RankClaim],
                       table: ProcessTable) -> RankClaim | None:
    """The claim of the nearest ancestor that makes one (None: none does)."""
    pid, seen = table.ppid(pid), 0
    while pid and seen < 64:
        if pid in claimed:
            return claimed[pid]
        pid, seen = table.ppid(pid), seen + 1
    return None


def _ancestors(pids: Sequence[int], below: Iterable[int], table: ProcessTable) -> set[int]:
    """The job's processes that are ancestors of any of ``below``."""
    job, out = set(pids), set()
    for pid in below:
        pid, seen = table.ppid(pid), 0
        while pid in job and pid not in out and seen < 64:
            out.add(pid)
            pid, seen = table.ppid(pid), seen + 1
    return out


class Numbers:
    """Gives each rank process its number in the job, for good.

    A job of one torch.distributed world numbers its ranks as they are. A job may hold several
    (verl's actor and rollout groups, a trainer beside an inference engine of its own), each
    with ranks 0..N-1: a process keeps the number it was first given; a new one takes its rank
    when no live process of another slot holds that number, else the lowest free number. A
    process claiming the slot (world, rank) a live numbered process already holds is no second
    rank. A number is free again once its process is gone from the process table (an elastic
    restart's new process of the same rank takes it back); a process that exited and is not yet
    reaped (a zombie, whose agent still claims its rank) keeps it: two worlds' ranks ending at
    once must not take each other's numbers."""

    def __init__(self) -> None:
        self._numbers: dict[tuple[int, int], int] = {}   # (pid, start) -> number
        self.several = False   # several worlds were seen at once: ranks say their world's rank

    def number(self, ranks: list[RankProcess], table: ProcessTable) -> list[RankProcess]:
        # the process, whatever it runs: Ray's workers exec and retitle themselves as they go
        ident = {r.pid: _process(table.procs[r.pid]) for r in ranks}
        present = {_process(info) for info in table.procs.values()}
        # a process keeps its number until it is reaped, also through a tick it is no rank in
        self._numbers = {i: n for i, n in self._numbers.items() if i in present}
        holders = {n: i for i, n in self._numbers.items()}
        slots = {(r.world, r.rank): ident[r.pid] for r in ranks if ident[r.pid] in self._numbers}
        out = []
        for rank in sorted(ranks, key=lambda r: (ident[r.pid] not in self._numbers, r.pid)):
            me = ident[rank.pid]
            if me not in self._numbers:
                if slots.get((rank.world, rank.rank), me) != me:
                    continue    # the slot's live process was numbered first
                number = rank.rank if rank.rank not in holders else _free(holders)
                self._numbers[me] = number
                holders[number], slots[(rank.world, rank.rank)] = me, me
            out.append(rank)
        worlds = {r.world for r in out if r.source == "process group" and r.world}
        self.several = self.several or len(worlds) > 1   # for good: ranks end one by one
        return [dataclasses.replace(r, rank=self._numbers[ident[r.pid]], world_rank=r.rank)
                if self.several or self._numbers[ident[r.pid]] != r.rank else r for r in out]


def _process(info: ProcInfo) -> tuple[int, int]:
    return info.pid, info.start_ticks


def _free(holders: Mapping[int, object]) -> int:
    return next(n for n in range(len(holders) + 1) if n not in holders)


def _is_python(info: ProcInfo, agent_pids: set[int]) -> bool:
    return info.pid in agent_pids or os.path.basename(info.name).startswith("python")


def _depth(pid: int, table: ProcessTable, launches: dict[int, Launch]) -> int:
    depth, pid = 0, table.ppid(pid)
    while pid in launches and depth < len(launches):   # a table read in passes may loop
        depth, pid = depth + 1, table.ppid(pid)
    return depth


def _single_process(table: ProcessTable, pids: list[int], launches: dict[int, Launch],
                    agent_pids: set[int], drivers: set[int],
                    roots: Collection[int] | None = None) -> int | None:
    if drivers:   # a Ray node's job: its Python processes are Ray's or its workers, no guess
        return None
    candidates = []
    for pid in pids:
        cmd = launches[pid].cmdline
        parent = launches.get(table.ppid(pid))
        forked = parent is not None and parent.cmdline == cmd
        if cmd and _is_python(table.procs[pid], agent_pids) and not forked and not _helper(cmd):
            candidates.append(pid)
    if not candidates:  # a job of no Python process: the command itself, unless a launcher
        root = pids[0] if pids else None   # or unknown (a zombie's, or one read mid-exec)
        if roots is not None and root not in roots:
            return None   # the command ended: what it left behind is no rank of its own
        command = launches[root].cmdline if root is not None else ()
        return root if command and not is_launcher(command) else None
    return min(candidates, key=lambda pid: (_depth(pid, table, launches), pid))


def _ray_drivers(table: ProcessTable, pids: Sequence[int], launches: Mapping[int, Launch]
                 ) -> set[int]:
    """The job's processes above a Ray node's own (raylet, GCS): the driver that started a Ray
    instance hands its work to Ray's workers and waits; it is their launcher, not a rank."""
    nodes = [p for p in pids if any(m in " ".join(launches[p].cmdline) for m in _RAY_NODE)]
    return _ancestors(pids, nodes, table)
