"""What a rank's agent publishes in its state file: phases, CUDA markers, identity, vLLM
engines, and the snapshot that holds them."""
from __future__ import annotations

from dataclasses import dataclass

from stalldoc.model.collectives import CollectiveRecord, GroupState


@dataclass(frozen=True)
class PhaseRecord:
    """A completed phase: its name and when it started and ended."""

    name: str
    started_at: float
    ended_at: float

    @property
    def duration(self) -> float:
        return self.ended_at - self.started_at


CYCLE_KINDS = ("rollout", "generate", "step")   # what starts a rank's cycle, the first entered


@dataclass(frozen=True)
class PhaseKinds:
    """How a rank's time went, by kind of phase (``statefile.PHASE_KINDS``), since its agent
    started: each kind's entries and the seconds it was the innermost kind, counted up to
    ``counted_at``. Exclusive time: a weight sync inside a rollout inside a step is the weight
    sync's alone."""

    counted_at: float
    entries: tuple[tuple[str, int], ...]     # (kind, entries), in PHASE_KINDS order
    seconds: tuple[tuple[str, float], ...]   # (kind, seconds innermost)

    def entered(self, kind: str) -> int:
        return dict(self.entries).get(kind, 0)

    def spent(self, kind: str) -> float:
        return dict(self.seconds).get(kind, 0.0)

    @property
    def cycle_kind(self) -> str | None:
        """The kind whose starts make the rank's cycles (``CYCLE_KINDS``, the first entered);
        None before any of them started."""
        return next((k for k in CYCLE_KINDS if self.entered(k) > 0), None)

    def starts_cycle(self, before: PhaseKinds | None) -> bool:
        """Whether this read is one to keep after ``before``, the last read kept: its cycle's
        kind was entered since (the first read of each cycle is what is measured between; the
        steps inside a rollout's cycle are not kept)."""
        kind = self.cycle_kind
        return before is None or (kind is not None and before.entered(kind) != self.entered(kind))

    def restarted(self, before: PhaseKinds | None) -> bool:
        """Whether this read comes from another process than ``before`` (counts that went
        down: the rank was started again, its counts start from nothing)."""
        return before is not None and any(before.entered(k) > self.entered(k)
                                           for k in CYCLE_KINDS)


@dataclass(frozen=True)
class CudaState:
    """What a rank's agent knows about its CUDA work (only for ranks that initialised CUDA)."""

    allocated: int | None           # allocator figures; None until the agent has read them
    reserved: int | None
    peak_allocated: int | None
    alloc_retries: int | None
    ooms: int | None
    sampled_at: float
    host_marker: int                # markers recorded by the host (phase and collective entries)
    gpu_marker: int                 # markers the GPU has completed
    host_label: str
    gpu_label: str
    gpu_done_at: float              # when the GPU was seen to complete gpu_marker
    oldest_pending_at: float        # when the oldest marker the GPU has not reached was recorded

    @property
    def markers_behind(self) -> int:
        return self.host_marker - self.gpu_marker


@dataclass(frozen=True)
class AgentIdentity:
    """Which program the agent runs in, and whether it may be signalled for a stack dump."""

    dump_signal: int          # 0: no faulthandler dump was registered
    exe_dev: int
    exe_ino: int
    startup_seconds: float    # from the start of sitecustomize to the agent running
    comm: str = ""            # the process's name when it registered (an exec changes it)


@dataclass(frozen=True)
class PhaseDetail:
    """What a channel phase talks to: the method called, ``server`` or ``group``, the endpoint
    (``host:port``), and since when the call runs."""

    phase: str
    method: str
    mode: str
    endpoint: str
    since: float

    def describe(self) -> str:
        """'update_named_param, server 10.0.0.5:8000'."""
        return f"{self.method}, {self.mode} {self.endpoint}" if self.endpoint else self.method


@dataclass(frozen=True)
class EngineSleepState:
    """One vLLM engine's sleep state, from the agent's hooks or from the engine's log lines."""

    engine: str                  # "engine 1" (the agent's slot), or the log's process prefix
    state: str                   # "awake", "asleep", "partly awake"
    asleep_at: float | None      # when it was last put to sleep
    woken_at: float | None       # when it was last woken (None: never)
    level: int | None = None     # the sleep level (the log lines do not say)
    sleeps: int = 0
    wakes: int = 0
    woken_tags: tuple[str, ...] = ()
    source: str = "agent"        # "agent" or "log"
    local_rank: int | None = None   # log lines with a launcher's rank prefix: that local rank

    @property
    def asleep(self) -> bool:
        return self.state != "awake"


@dataclass(frozen=True)
class AgentSnapshot:
    """Everything one rank's state file says at the moment it was read."""

    pid: int
    rank: int
    local_rank: int
    world_size: int
    status: int
    started_at: float
    heartbeat_at: float
    marker_seq: int
    last_marker_at: float
    exit_code: int | None
    phase_stack: tuple[str, ...]
    error: str
    phases_completed: int
    phases: tuple[PhaseRecord, ...]
    groups: tuple[GroupState, ...]
    cuda: CudaState | None = None
    identity: AgentIdentity | None = None
    phase_detail: PhaseDetail | None = None     # the innermost phase with a detail (version 4)
    engines: tuple[EngineSleepState, ...] = ()  # vLLM engines of this process (version 4)
    c10d_issued: int = 0        # collectives issued on its process groups, by their sequence
    c10d_rose_at: float = 0.0   # numbers (DDP's C++ ones included); when that last rose
    phase_thread: int = 0       # native id of the thread that entered the innermost phase
    kinds: PhaseKinds | None = None   # time by kind of phase (None: no phase of a kind yet)

    @property
    def channel(self) -> PhaseDetail | None:
        """The detail of the innermost phase, when that phase has one."""
        detail = self.phase_detail
        return detail if detail is not None and detail.phase == self.phase else None

    @property
    def phase(self) -> str:
        """The innermost phase the process is in ('' outside any phase)."""
        return self.phase_stack[-1] if self.phase_stack else ""

    @property
    def collective_seq(self) -> int:
        """Total collectives completed over all groups: rises whenever a collective finishes."""
        return sum(g.completed for g in self.groups)

    @property
    def pending(self) -> tuple[CollectiveRecord, ...]:
        """Collectives entered and not completed, one per group at most (the newest)."""
        out = []
        for group in self.groups:
            if group.ring and not group.ring[-1].completed:
                out.append(group.ring[-1])
        return tuple(out)
