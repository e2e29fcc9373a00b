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
(``IO_WORK_BPS``, its I/O read each tick: an actor downloading a checkpoint waits in a socket
and works all the same). A process busy in one unchanging stack for the busy timeout is said to
spin (SD121, a warning): it works, so it is never a stall.

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
from stalldoc.detect.work import IO_WORK_BPS
from stalldoc.model.ray_job import ACTOR, JobOutside, OutsideSeen, RayProcess, RayState
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks
from stalldoc.probes.connections import external_peers
from stalldoc.probes.proc_table import ProcessGone, read_io
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
    io: tuple[float, int] | None = None   # (when, rchar + wchar) at its latest I/O reading


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
        self.pool: ThreadPoolExecutor | None = None   # reads Ray's state API off the tick
        self.asking: Future | None = None
        self.asked_at = float("-inf")
        self.read_at: float | None = None      # when the latest answer was asked for
        self.fingerprint: tuple = ()           # the job's actors and tasks, as last answered
        self.changed_at = 0.0                  # when an answer first showed them as they are
        self.ranked = False                    # the job has ranks (as the last refresh said)

    def refresh(self, pids: Iterable[int], ranks: Iterable[int],
                now: float | None = None) -> list[str]:
        """Learn the driver and the actors among the job's processes ``pids``; ``ranks`` (the
        ranks, and every process whose agent claims one) are the ranks' part, not this one.
        Returns what to say of the new ones."""
        if not self.agent_dir:
            return []
        pids, ranks = set(pids), set(ranks)
        self.ranked = bool(ranks)
        found = ray_processes(self.agent_dir, (self._published() & pids) - ranks)
        said = []
        for pid in [p for p, s in self.known.items() if p not in found and not s.process.adopted]:
            del self.known[pid]
        for pid, process in found.items():
            if pid not in self.known or self.known[pid].process != process:
                self.known[pid] = _Process(process)
                said.append(f"{process.label}: its ranks' work comes from it, it is no rank"
                            + (" (it joined a Ray cluster started apart)" if process.joined
                               else ""))
        return said + self._adopt(time.time() if now is None else now, pids)

    @property
    def joined(self) -> RayProcess | None:
        """The driver, when it joined a cluster started apart: then the job is this part."""
        return next((s.process for s in self.known.values() if s.process.joined
                     and s.process.dashboard and s.process.job_id), None)

    def _adopt(self, now: float, pids: set[int]) -> list[str]:
        """The processes of a driver that joined a cluster started apart, from Ray's state API:
        its job's actors and the workers running its tasks, on its node, outside the job's
        tree. Asked every ``every`` seconds in a thread; the answer is taken on a later
        tick."""
        driver = self.joined
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
            self.asking = self.pool.submit(job_state, driver.dashboard, driver.job_id)
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
                       sorted((t.name, t.state, t.actor_id, t.pid or 0) for t in state.tasks))
        if fingerprint != self.fingerprint:   # the job moved: a call ended or began
            self.fingerprint, self.changed_at = fingerprint, self.asked_at
            self.moved_at = max(self.moved_at, self.asked_at)
        self.read_at = self.asked_at
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
        if between or (not self.ranked and self.joined is not None):
            self.between_at = now
            self.turn_since = now if self.turn_since is None else self.turn_since
        elif self.turn_since is not None and in_task and now - self.between_at > self.hold:
            self.turn_since = None   # a rank has had work in hand for a while: the ranks' turn
            for seen in self.known.values():
                seen.busy_since = None
        for stacks in self.background.done():
            if stacks.pid in self.known:
                self._seen(self.known[stacks.pid], stacks)
        for seen in self.known.values():
            self._read_io(seen, now)
        if self.turn_since is not None:
            for seen in self.known.values():
                if now - seen.at >= self.every:
                    self.background.request(_as_rank(seen.process))

    def _read_io(self, seen: _Process, now: float) -> None:
        """The process's bytes read and written since its last reading: at a rank's rate of
        work, it worked now, whatever its stack waits on."""
        try:
            total = read_io(seen.process.pid)
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
        joined = self.joined is not None
        if joined and (self.read_at is None or now - self.read_at > fresh + self.every):
            return None   # the job's actors and tasks not asked for lately
        seen = list(self.known.values())
        if any(s.kind is None or s.at < self.turn_since or now - s.at > fresh for s in seen):
            return None
        if any(s.kind.working for s in seen if s.kind is not None):
            return None
        return max([self.turn_since] + [s.worked_at for s in seen]
                   + ([self.changed_at] if joined else []))

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
        for seen in self.known.values():
            self._seen(seen, self.probe.capture(_as_rank(seen.process), False, True, False))
        peers = external_peers([_as_rank(s.process) for s in self.known.values()],
                               set(job_pids) | set(self.known) | self._cluster())
        driver = next((s.process for s in self.known.values() if s.process.dashboard), None)
        state = _state_of(driver) if driver is not None else None
        seen = tuple(dataclasses.replace(self._outside(s, now), peers=peers.get(-pid, ()))
                     for pid, s in self.known.items())
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
