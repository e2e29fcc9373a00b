"""The driver and the actors of a Ray job that are no rank: the part of the job that hands the
ranks their work. While any rank has work in hand the ranks decide a stall; once every rank
waits between tasks, it is this part's turn, and the job is stalled only when nothing here
works either.

Which process is the driver and which an actor is what Ray says inside it (its agent's
``ray-<pid>.json``). While every rank waits for its next task, each of these processes' stacks
is sampled off the tick (py-spy ``--nonblocking``, never a pause) every ``resample_every``
seconds and read for its kind: a process whose stack works has work in hand (a reward model
scoring, an engine generating); one that waits (``ray.get``, a socket, a lock, a rendezvous)
or idles in its task loop has none, unless it reads or writes bytes at a rank's rate of work
(``IO_WORK_BPS``, its I/O read each tick, files' bytes and its TCP sockets': an actor
downloading a checkpoint waits in a socket and works all the same). A process busy in one
unchanging stack for the busy timeout is said to spin (SD121, a warning): it works, so it is
never a stall.

A driver that joined a cluster started apart (``ray start``, then ``ray.init(address=...)``, as
verl's multi-node docs do) is the only process of the watched command: its actors are the
cluster's workers, outside the command's tree and without stalldoc's agent. They are learnt
from Ray's state API (the driver's job, on the driver's node, as often as stacks are sampled,
off the tick) and sampled like the others; which of them are ranks is not known, so the job has
no ranks here and it is this part's turn all the time, and a change in the job's actors or
tasks between two answers is the job moving. They are never handed to the relay:
stopping the job never touches the cluster's processes."""
from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

import psutil

from stalldoc.agent.ray_facts import FILE_PREFIX
from stalldoc.detect.progress import resample_every
from stalldoc.analysis.stacks import INNER_EXPRESSIONS, own_function
from stalldoc.detect.stack_kind import StackKind, classify
from stalldoc.detect.work import BUSY_CPU_PERCENT, CHILD_CPU_PERCENT, IO_WORK_BPS
from stalldoc.model.ray_job import (ACTOR, DRIVER, WORKER, JobOutside, OutsideSeen, RayProcess,
                                    RayState)
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks
from stalldoc.probes.connections import external_peers
from stalldoc.probes.host import descendants
from stalldoc.probes.proc_table import ProcessGone, ProcessTable, read_io
from stalldoc.probes.tcp_bytes import TcpBytes
from stalldoc.probes.pyspy import BackgroundStacks, StackProbe
from stalldoc.probes.ray_state import job_state, ray_processes, read_state


@dataclass
class _Process:
    process: RayProcess
    kind: StackKind | None = None
    stacks: RankStacks | None = None
    at: float = 0.0                  # when the latest sample was taken
    worked_at: float = 0.0           # the latest sample that worked
    busy_since: float | None = None  # working in one unchanging stack since
    signature: tuple = ()
    other: bool = False              # the last sample differed (one torn read of a spinning
                                     # stack is no move; two differing samples in a row are)
    spun: tuple[StackKind, RankStacks] | None = None   # the latest sample of that one stack
    created: float = 0.0             # an adopted actor's process start (a reused pid is not it)
    io: tuple[float, int] | None = None   # (when, rchar + wchar + TCP bytes) at its last
    cpu: tuple[float, float] | None = None   # (when, its CPU seconds) at its latest reading
    busy: bool = True                # its own CPU at its latest reading was a busy one's
    children: dict[int, tuple[int, float]] = dataclasses.field(default_factory=dict)
                                     # its own children's (start, CPU seconds) at that reading


class RayJob:
    """The job's driver and its actors that are no rank, and whether they work."""

    def __init__(self, agent_dir: str | None, probe: StackProbe, floor: float) -> None:
        self.agent_dir = agent_dir
        self.probe = probe
        self.background = BackgroundStacks(probe, workers=2)
        self.every = resample_every(floor)
        # how long the turn outlasts a tick where not every rank was seen waiting (a rank's
        # stack read late on a loaded node); a rank that has work in hand decides anyway
        self.hold = max(2 * self.every, floor)
        self.known: dict[int, _Process] = {}
        self.turn_since: float | None = None   # every rank has waited between tasks since
        self.between_at = 0.0   # the last tick every rank waited (a rank's stack read late on
                                # a loaded node leaves it unknown for a tick or two)
        self.moved_at = 0.0                    # the latest tick something here worked
        self.tcp = TcpBytes(os.getpid())       # TCP bytes each process moved (downloads)
        self.pool: ThreadPoolExecutor | None = None   # reads Ray's state API off the tick
        self.asking: Future | None = None
        self.asked_at = float("-inf")
        self.read_at: float | None = None      # when the latest answer was asked for
        self.fingerprint: tuple = ()           # the job's actors and tasks, as last answered
        self.changed_at = 0.0                  # when an answer first showed them as they are
        self.ranked = False                    # the job has ranks (as the last refresh said)
        self.rank_pids: set[int] = set()
        self.alone_turn = False                # the turn is this part's because no rank is known
        self.up_ticks: int | None = None       # when the driver's Ray node was first seen up
        self.last_uptime: int | None = None    # when the last process table was read
        self.unplaceable_since: float | None = None   # a placement group no node can hold since
        self.hopeless_at: float | None = None   # the job's output last said no node type can

    def refresh(self, pids: Iterable[int], ranks: Iterable[int], now: float | None = None,
                table: ProcessTable | None = None) -> list[str]:
        """Learn the driver, the actors and the task workers among the job's processes
        ``pids``; ``ranks`` (the ranks, and every process whose agent claims one) are the
        ranks' part, not this one. ``table``: this tick's process table, for the CPU of each
        process here and of its own children. Returns what to say of the new ones (a task
        worker goes unsaid: Ray keeps a pool of them)."""
        if not self.agent_dir:
            return []
        now = time.time() if now is None else now
        pids, ranks = set(pids), set(ranks)
        self.ranked, self.rank_pids = bool(ranks), ranks
        found = ray_processes(self.agent_dir, (self._published() & pids) - ranks)
        said = []
        for pid in [p for p, s in self.known.items() if p not in found and not s.process.adopted]:
            del self.known[pid]
        for pid, process in found.items():
            if pid not in self.known or self.known[pid].process != process:
                self.known[pid] = _Process(process)
                if process.role != WORKER:
                    said.append(f"{process.label}: its ranks' work comes from it, it is no "
                                "rank" + (" (it joined a Ray cluster started apart)"
                                          if process.joined else ""))
        if table is not None:
            self._read_cpu(table, now)
        return said + self._adopt(now, pids)

    def _read_cpu(self, table: ProcessTable, now: float) -> None:
        """Each process's own CPU since its last reading (a task worker's decides whether its
        stack is worth reading), and its descendants': at ``CHILD_CPU_PERCENT`` of a core they
        work for it (a reward sandbox, an engine's core process; below the driver's Ray, a
        worker starting or a runtime environment being installed), whatever its stack waits
        on. Its descendants stop at the job's other processes here and its ranks (judged on
        their own), and leave out the processes Ray started for its node (the GCS, the raylet,
        the dashboard) and what ran below them once that node was up (its agents, the
        dashboard's modules): Ray's upkeep, not the job's work. Thirteen such processes idle
        at a jiffy or two each summed to a tenth of a core in a half-second tick."""
        stop = set(self.known) | self.rank_pids
        daemons = {d for s in self.known.values() for d in s.process.daemons}
        if daemons and self.up_ticks is None:
            self.up_ticks = table.uptime   # the driver's Ray is up: what runs below it is Ray's
        upkeep = daemons | {p for d in daemons for p in descendants(d, table.children, stop)
                            if table.procs[p].start_ticks < (self.up_ticks or 0)}
        last, self.last_uptime = self.last_uptime, table.uptime
        for seen in self.known.values():
            info = table.get(seen.process.pid)
            if info is None:
                continue
            before, seen.cpu = seen.cpu, (table.t, info.cpu_seconds)
            children = {c: (table.procs[c].start_ticks, table.procs[c].cpu_seconds)
                        for c in descendants(seen.process.pid, table.children, stop)
                        if c not in upkeep}
            earlier, seen.children = seen.children, children
            if before is None or table.t <= before[0]:
                continue
            seconds = table.t - before[0]
            seen.busy = 100 * (info.cpu_seconds - before[1]) / seconds >= BUSY_CPU_PERCENT
            spent = sum(cpu - earlier[c][1] if c in earlier and earlier[c][0] == start
                        else cpu if last is not None and start >= last else 0.0
                        for c, (start, cpu) in children.items())
            if 100 * spent / seconds >= CHILD_CPU_PERCENT:
                seen.worked_at = now
                self.moved_at = max(self.moved_at, now)

    @property
    def joined(self) -> RayProcess | None:
        """The driver, when it joined a cluster started apart: then the job is this part."""
        return next((s.process for s in self.known.values() if s.process.joined
                     and s.process.dashboard and s.process.job_id), None)

    @property
    def alone(self) -> bool:
        """No rank is known and a driver is: the job is this part, all the time (a driver
        whose actors run in a cluster started apart; or a Ray job whose processes joined no
        process group: a data preparation, an RL loop of actors calling each other)."""
        return not self.ranked and any(s.process.role == DRIVER for s in self.known.values())

    @property
    def asked(self) -> RayProcess | None:
        """The driver whose job is asked of Ray's state API every ``every`` seconds: a joined
        one, and one of a job that is this part alone (its changes are the job moving, its
        placement groups say whether it waits for the cluster to grow)."""
        joined = self.joined
        if joined is not None or not self.alone:
            return joined
        return next((s.process for s in self.known.values() if s.process.role == DRIVER
                     and s.process.dashboard and s.process.job_id), None)

    def _adopt(self, now: float, pids: set[int]) -> list[str]:
        """The processes of a driver that joined a cluster started apart, from Ray's state API:
        its job's actors and the workers running its tasks, on its node, outside the job's
        tree. Asked every ``every`` seconds in a thread; the answer is taken on a later
        tick."""
        driver = self.asked
        said: list[str] = []
        if self.asking is not None and self.asking.done():
            state, self.asking = self._answer(self.asking), None
            if state is not None and driver is not None:
                said = self._take(state, driver, pids)
        self._forget_adopted({p for p, s in self.known.items() if s.process.adopted}
                             if driver is not None else set())
        if driver is not None and self.asking is None and now - self.asked_at >= self.every:
            self.pool = self.pool or ThreadPoolExecutor(1, thread_name_prefix="stalldoc-ray")
            self.asked_at = now
            self.asking = self.pool.submit(job_state, driver.dashboard, driver.job_id, 3.0, True)
        return said

    @staticmethod
    def _answer(asking: Future) -> RayState | None:
        try:
            return asking.result()
        except (OSError, ValueError):
            return None   # asked again later; the stall waits for an answer

    def _take(self, state: RayState, driver: RayProcess, pids: set[int]) -> list[str]:
        """Adopt what the answer shows here; a change in the job's actors or tasks since the
        last answer is the job moving."""
        fingerprint = (sorted((a.actor_id, a.state, a.pid or 0) for a in state.actors),
                       sorted((t.name, t.state, t.actor_id, t.pid or 0) for t in state.tasks),
                       sorted((g.group_id, g.state) for g in state.placement_groups))
        if fingerprint != self.fingerprint:   # the job moved: a call ended or began
            self.fingerprint, self.changed_at = fingerprint, self.asked_at
            self.moved_at = max(self.moved_at, self.asked_at)
        self.read_at = self.asked_at
        unplaceable = any(g.pending and g.scheduling == INFEASIBLE
                          for g in state.placement_groups)
        self.unplaceable_since = (self.unplaceable_since or self.asked_at) if unplaceable \
            else None
        here = {a.pid: (a.class_name, a.actor_id) for a in state.actors
                if a.pid and a.state != "DEAD" and a.node_id == driver.node_id}
        here.update({t.pid: (t.name.split(".")[0], t.actor_id) for t in state.tasks
                     if t.running and t.pid and t.node_id == driver.node_id
                     and t.pid not in here})
        here = {pid: what for pid, what in here.items() if pid not in pids}
        self._forget_adopted(set(here))
        said = []
        for pid, (name, actor_id) in here.items():
            created = _created(pid)
            if pid in self.known or created is None:
                continue
            process = RayProcess(pid, ACTOR, name, actor_id, driver.job_id,
                                 node_id=driver.node_id, adopted=True)
            self.known[pid] = _Process(process, created=created)
            said.append(f"{process.label}: of this job, in the Ray cluster started apart, "
                        "known from Ray's state API (no stalldoc agent in it: which of the "
                        "job's processes are ranks is not known)")
        return said

    def _forget_adopted(self, keep: set[int]) -> None:
        """Adopted actors no longer alive here, or whose pid a new process took."""
        for pid, seen in list(self.known.items()):
            if seen.process.adopted and (pid not in keep or _created(pid) != seen.created):
                del self.known[pid]

    def _published(self) -> set[int]:
        try:
            names = os.listdir(self.agent_dir or "")
        except OSError:
            return set()
        return {int(n[len(FILE_PREFIX):-5]) for n in names
                if n.startswith(FILE_PREFIX) and n.endswith(".json")
                and n[len(FILE_PREFIX):-5].isdigit()}

    def observe(self, now: float, between: bool, in_task: bool = True) -> None:
        """One tick: ``between``, every live rank waits for its next task; ``in_task``, a rank
        was seen with work in hand (a rank not read lately is neither: on a loaded node its
        read comes late, and the turn holds). Takes the samples finished since the last tick
        and asks for those due. A driver that joined a cluster started apart, with no rank
        known, has the turn all the time."""
        alone = self.alone
        if between or alone:
            self.between_at = now
            self.turn_since = now if self.turn_since is None else self.turn_since
            self.alone_turn = alone and not between
        elif self.turn_since is not None and (
                self.alone_turn or (in_task and now - self.between_at > self.hold)):
            self.turn_since = None   # a rank has had work in hand for a while, or the job
            for seen in self.known.values():   # has ranks now: the ranks' turn
                seen.busy_since = None
        for stacks in self.background.done():
            if stacks.pid in self.known:
                self._seen(self.known[stacks.pid], stacks)
        if self.known:
            self.tcp.refresh()
        for seen in self.known.values():
            self._read_io(seen, now)
        self.tcp.forget(set(self.known))
        if self.turn_since is not None:
            for seen in self.known.values():
                if now - seen.at < self.every:
                    continue
                if seen.process.role == WORKER and not seen.busy:
                    seen.kind, seen.stacks, seen.at = NO_CPU, None, now   # no stack to read
                    seen.busy_since, seen.signature, seen.spun = None, (), None
                else:
                    self.background.request(_as_rank(seen.process))

    def _read_io(self, seen: _Process, now: float) -> None:
        """The process's bytes read and written since its last reading: at a rank's rate of
        work, it worked now, whatever its stack waits on."""
        try:
            total = read_io(seen.process.pid)
            if total is not None:   # and over TCP (a download: recv is no read in rchar)
                total += self.tcp.of(seen.process.pid)
        except ProcessGone:
            total = None
        before, seen.io = seen.io, (now, total) if total is not None else None
        if before is None or total is None or now <= before[0]:
            return
        if (total - before[1]) / (now - before[0]) >= IO_WORK_BPS:
            seen.worked_at = now
            self.moved_at = max(self.moved_at, now)

    def _seen(self, seen: _Process, stacks: RankStacks) -> None:
        kind = classify(stacks)
        if not kind.kind:
            return
        seen.kind, seen.stacks, seen.at = kind, stacks, stacks.t
        if kind.working:
            seen.worked_at = stacks.t
            self.moved_at = max(self.moved_at, stacks.t)
            signature = _spin_signature(kind)
            if not signature[1]:
                return   # a torn read (py-spy --nonblocking): no frames of the thread's own
            if seen.busy_since is None or (signature != seen.signature and seen.other):
                seen.busy_since, seen.signature = stacks.t, signature   # it moved on
                seen.other = False
            else:
                seen.other = signature != seen.signature
            if not seen.other:
                seen.spun = (kind, stacks)
        else:
            seen.busy_since, seen.signature, seen.spun = None, (), None

    def quiet_since(self, now: float) -> float | None:
        """Since when nothing of the job has worked, ranks and this part together (None: this
        part has work in hand, or has not been seen to have none). Every process here must have
        been read since the turn began, and lately."""
        if self.turn_since is None or not self.known:
            return None
        fresh = 2 * self.every + 2
        asked = self.asked is not None
        if asked and (self.read_at is None or now - self.read_at > fresh + self.every):
            return None   # the job's actors and tasks not asked for lately
        if self._waits_for_cluster(now):
            return None   # it waits for the cluster to grow: a node takes minutes to join
        seen = list(self.known.values())
        if any(s.kind is None or s.at < self.turn_since or now - s.at > fresh for s in seen):
            return None
        if any(s.kind.working for s in seen if s.kind is not None):
            return None
        return max([self.turn_since] + [s.worked_at for s in seen]
                   + ([self.changed_at] if asked else []))

    def said_unplaceable(self, t: float) -> None:
        """The job's output said at ``t`` that no node type of the cluster can hold a request
        of the job (Ray's autoscaler, ``detect/cluster_wait.py``): the cluster will not grow
        for it by itself."""
        self.hopeless_at = t

    def _waits_for_cluster(self, now: float) -> bool:
        """Ray's state says a placement group of the job waits for a node the cluster does not
        have (INFEASIBLE), for less than ``RESOURCE_WAIT``, and its autoscaler has not said
        lately that no node type can hold it: a node may be on its way (an autoscaler
        launching one, a node started late), and the job waits for the cluster, not on
        itself."""
        said = self.hopeless_at is not None and now - self.hopeless_at < RESOURCE_WAIT
        return (self.unplaceable_since is not None and not said
                and now - self.unplaceable_since < RESOURCE_WAIT)

    def spinning(self, now: float, busy_timeout: float) -> tuple[OutsideSeen, ...]:
        """The processes here busy in one unchanging stack for ``busy_timeout`` while every
        rank waits for its next task."""
        return tuple(self._outside(s, now) for s in self.known.values()
                     if self.turn_since is not None and s.busy_since is not None
                     and now - max(s.busy_since, self.turn_since) >= busy_timeout)

    def view(self, now: float, job_pids: Iterable[int]) -> JobOutside:
        """Where the job stands at a stall: fresh stacks of each process here, the servers
        outside the job they talk to (``job_pids``: the job's own processes), and Ray's state
        from the driver's dashboard."""
        driver = next((s.process for s in self.known.values() if s.process.dashboard), None)
        state = _state_of(driver) if driver is not None else None
        running = {t.pid for t in state.tasks if t.running} if state is not None else set()
        shown = {pid: s for pid, s in self.known.items()
                 if s.process.role != WORKER or s.kind is not NO_CPU or pid in running}
        for seen in shown.values():
            self._seen(seen, self.probe.capture(_as_rank(seen.process), False, True, False))
        peers = external_peers([_as_rank(s.process) for s in shown.values()],
                               set(job_pids) | set(self.known) | self._cluster())
        seen = tuple(dataclasses.replace(self._outside(s, now), peers=peers.get(-pid, ()))
                     for pid, s in shown.items())
        return JobOutside(self.turn_since or now, seen, state)

    def _cluster(self) -> set[int]:
        """The processes of a cluster started apart, on this node: the process groups of the
        processes that started its workers here (the raylet's: GCS, dashboard, its workers).
        Their sockets are Ray's own, no server the job waits on."""
        starters = {_parent(pid) for pid, s in self.known.items() if s.process.adopted}
        groups = {group for group in map(_group, starters - {None, 0, 1}) if group}
        return {pid for pid in psutil.pids() if _group(pid) in groups} if groups else set()

    def _outside(self, seen: _Process, now: float) -> OutsideSeen:
        """The process as seen; while busy in one stack, as that stack's latest sample shows it
        (a differing sample, a torn read or the loop's first step out, does not move it)."""
        kind, stacks = seen.kind, seen.stacks
        busy = now - seen.busy_since if seen.busy_since is not None else 0.0
        if seen.busy_since is not None and seen.spun is not None:
            kind, stacks = seen.spun
        return OutsideSeen(seen.process, stacks, kind.kind if kind else "",
                           _place(kind, stacks), round(busy, 1))

    def close(self) -> None:
        self.background.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


# a loop that spins in ``sum(x for x in values)`` is in its function all the time
_INNER = INNER_EXPRESSIONS
# a task worker that used no CPU since its last reading: between tasks, or waiting in one (its
# stack is read at a stall when Ray says it runs a task)
NO_CPU = StackKind("idle: no CPU")
INFEASIBLE = "INFEASIBLE"   # Ray's scheduling state of a placement group no node can hold
# how long a job whose placement group no node can hold waits for the cluster to grow before its
# quiet counts: an autoscaler's node, or one started by hand, takes minutes to boot and join
RESOURCE_WAIT = 300.0


def _spin_signature(kind: StackKind) -> tuple:
    """The deciding thread and its functions, an expression's own frames left out."""
    return kind.thread, tuple(f for f in kind.shape if f[0].rsplit(".", 1)[-1] not in _INNER)


def _place(kind: StackKind | None, stacks: RankStacks | None) -> Frame | None:
    """The deciding thread's innermost frame of the user's own code that is a function's
    (not an expression's inside it), else the kind's frame."""
    if kind is None or stacks is None:
        return kind.frame if kind is not None else None
    thread = next((t for t in stacks.threads if t.thread_id == kind.thread), None) or next(
        (t for t in stacks.threads if kind.frame is not None and kind.frame in t.frames), None)
    own = own_function(thread) if thread is not None else None
    return own or kind.frame


def _state_of(driver: RayProcess) -> RayState:
    """Ray's state of the driver's job (of the whole cluster when its job is not known)."""
    if not driver.job_id:
        return read_state(driver.dashboard)
    try:
        return job_state(driver.dashboard, driver.job_id, groups=True)
    except (OSError, ValueError) as exc:
        return RayState(source=driver.dashboard,
                        error=f"Ray's state API at {driver.dashboard} did not answer: {exc}")


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def _group(pid: int | None) -> int | None:
    try:
        return os.getpgid(pid) if pid else None
    except OSError:
        return None


def _created(pid: int) -> float | None:
    """When the process with ``pid`` started (None: there is none)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _as_rank(process: RayProcess) -> RankProcess:
    """The process as the probes take it (its rank minus its pid: it is none)."""
    return RankProcess(-process.pid, process.pid, None, (), from_env=False, source="")
