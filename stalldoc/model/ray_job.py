"""The parts of a Ray job that are not its ranks: the driver that runs the loop, the actors that
hold no rank (rollout engines, reward workers, a task runner), and what Ray's own state API says
of them at a stall (actors, the tasks that run and those queued behind them)."""
from __future__ import annotations

from dataclasses import dataclass

from stalldoc.model.stacks import Frame, RankStacks

DRIVER = "driver"
ACTOR = "actor"
WORKER = "worker"     # a worker process of the job that holds no actor: it runs plain tasks


@dataclass(frozen=True)
class RayProcess:
    """A process of the job that Ray says is its driver, an actor that is no rank, or a worker
    that runs its plain tasks."""

    pid: int
    role: str                 # DRIVER, ACTOR or WORKER
    actor_class: str = ""     # an actor's class, as Ray knows it
    actor_id: str = ""
    job_id: str = ""
    dashboard: str = ""       # the driver's: where the cluster serves its state API
    node_id: str = ""         # the Ray node it runs on
    joined: bool = False      # a driver that joined a cluster started apart (``ray start``)
    adopted: bool = False     # an actor of such a cluster, known from Ray's state API alone
                              # (outside the watched command's tree, without stalldoc's agent)
    daemons: tuple[int, ...] = ()   # a driver's: the processes Ray started for its node

    @property
    def label(self) -> str:
        if self.role == DRIVER:
            return f"the driver (pid {self.pid})"
        if self.role == WORKER:
            return f"task worker (pid {self.pid})"
        return f"actor {self.actor_class or '?'} (pid {self.pid})"


@dataclass(frozen=True)
class RayTask:
    """A task or actor call Ray has not finished: running, or queued behind another."""

    name: str                 # ``Class.method`` or the function's name
    state: str                # Ray's: RUNNING, SUBMITTED_TO_WORKER, PENDING_ARGS_AVAIL, ...
    actor_id: str = ""
    pid: int | None = None    # the worker running it (None: not started)
    started_at: float | None = None
    node_id: str = ""

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


@dataclass(frozen=True)
class RayActor:
    actor_id: str
    class_name: str
    state: str                # ALIVE, PENDING_CREATION, DEPENDENCIES_UNREADY, RESTARTING, DEAD
    pid: int | None = None
    name: str = ""
    death: str = ""           # why it died, in Ray's words
    resources: str = ""       # what it asks to be placed, as Ray prints it ({'GPU': 1.0})
    job_id: str = ""
    node_id: str = ""

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"


@dataclass(frozen=True)
class RayPlacementGroup:
    """A placement group of the job: the bundles of resources Ray reserves together."""

    group_id: str
    name: str
    state: str                # PENDING, CREATED, REMOVED, RESCHEDULING
    bundles: tuple[str, ...] = ()   # each bundle's resources, as Ray prints them
    scheduling: str = ""      # Ray's scheduling state of a pending one (INFEASIBLE, ...)

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "RESCHEDULING")

    @property
    def label(self) -> str:
        return f"placement group {self.name or self.group_id[:12]}"


@dataclass(frozen=True)
class RayState:
    """What the cluster's state API answered (``error``: why nothing was read)."""

    actors: tuple[RayActor, ...] = ()
    tasks: tuple[RayTask, ...] = ()
    source: str = ""          # the endpoint read
    error: str = ""
    placement_groups: tuple[RayPlacementGroup, ...] = ()

    def queued_behind(self, task: RayTask) -> tuple[RayTask, ...]:
        """Calls of the same actor that wait for ``task`` to end (an actor runs one at a time
        unless it was made with more concurrency)."""
        return tuple(t for t in self.tasks if t.actor_id and t.actor_id == task.actor_id
                     and not t.running)

    def actor(self, actor_id: str) -> RayActor | None:
        return next((a for a in self.actors if a.actor_id == actor_id), None)

    def held_by_actor(self) -> tuple[tuple[RayTask, RayActor], ...]:
        """Calls that wait because their actor is not alive: never created yet (no node can
        place it), restarting, or dead."""
        return tuple((t, a) for t in self.tasks if not t.running
                     for a in [self.actor(t.actor_id)] if a is not None and not a.alive)


@dataclass(frozen=True)
class OutsideSeen:
    """One process outside the ranks as a stall found it: its stacks and what they show."""

    process: RayProcess
    stacks: RankStacks | None
    kind: str = ""                 # the stack's kind: "working", "waiting: <on what>", ...
    frame: Frame | None = None     # its user frame (else the innermost)
    busy_for: float = 0.0          # seconds in one unchanging working stack
    peers: tuple[str, ...] = ()    # host:port of its TCP peers outside the job (a stall only)


@dataclass(frozen=True)
class JobOutside:
    """Where a Ray job stands when every rank waits for its next task: the driver, the actors
    that are no rank, and Ray's state of them."""

    since: float                                # every rank has waited between tasks since
    seen: tuple[OutsideSeen, ...] = ()
    ray: RayState | None = None

    @property
    def driver(self) -> OutsideSeen | None:
        return next((s for s in self.seen if s.process.role == DRIVER), None)

    def of_pid(self, pid: int | None) -> OutsideSeen | None:
        return next((s for s in self.seen if s.process.pid == pid), None)
