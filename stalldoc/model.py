"""Data passed between the parts of the watcher: frozen dataclasses, nothing else.

A leaf: it imports the standard library only, never another stalldoc module (a test pins it),
so every part can import it and none of it drags another part in. What reads or computes these
records lives next to its source (agent/state_reader.py, launch/config.py, launch/resources.py,
which re-export the records they make)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


_TRUE = {"true", "1", "yes", "on"}


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


@dataclass(frozen=True)
class RankProcess:
    """A process of the job that is a rank (not a launcher, not a rank's own worker)."""

    rank: int
    pid: int
    local_rank: int | None
    cmdline: tuple[str, ...]
    from_env: bool = True   # claimed by the process (False: the guessed single-process rank 0)
    source: str = "RANK"    # how its rank is known (RankClaim.source); "" for the guess
    world: str = ""         # its torch.distributed world (the store's address); "" unknown
    world_rank: int | None = None   # its rank in that world when ``rank`` numbers several


# any other source (a launcher's variable): 1; "Lightning": the rank Lightning's own launcher
# hands a process it starts (its place in the tree, as exact as RANK)
CLAIM_STRENGTH = {"process group": 3, "RANK": 2, "Lightning": 2}


@dataclass(frozen=True)
class RankClaim:
    """Which rank a process says it is: from the process group it created, from RANK, or from
    a launcher's variable (SLURM_PROCID, OMPI_COMM_WORLD_RANK, ...), with that rank's world."""

    source: str
    rank: int
    local_rank: int | None = None
    world_size: int | None = None
    world: str = ""

    @property
    def strength(self) -> int:
        """3 from the process group, 2 from RANK or Lightning's tree, 1 from a launcher's
        variable."""
        return CLAIM_STRENGTH.get(self.source, 1)


@dataclass(frozen=True)
class HostSample:
    """What psutil says about one rank at one tick."""

    t: float
    rank: int
    pid: int
    cpu_seconds: float
    rss_bytes: int
    threads: int
    status: str            # running / sleeping / disk-sleep / stopped / zombie / ...
    host_available_bytes: int
    cpu_percent: float | None = None   # since the previous tick; 100 = one core
    children: int = 0                  # live descendants that are not ranks themselves
    children_cpu_percent: float | None = None   # those descendants' CPU since the previous tick
    io_bps: float | None = None        # bytes read + written per second (rchar + wchar, the
                                       # rank and its descendants) since the previous tick
    cpu_wait_percent: float | None = None   # its threads runnable but waiting for a CPU (the
                                       # run-queue delay) since the previous tick; 100 = one
                                       # thread the whole time. None: the kernel keeps no count
    children_cpu_wait_percent: float | None = None   # its descendants' (their main threads')


@dataclass(frozen=True)
class HostMemory:
    """What psutil says about the whole node at one tick."""

    t: float
    available_bytes: int
    total_bytes: int
    swap_in_bps: float | None     # bytes swapped in per second since the last tick
    swap_out_bps: float | None
    load1: float
    cores: int
    running: int | None = None    # runnable threads right now (/proc/stat procs_running)


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists on a GPU; ``rank`` is the rank whose process tree holds it."""

    pid: int
    used_bytes: int | None
    rank: int | None = None


@dataclass(frozen=True)
class GpuSample:
    """What NVML says about one GPU at one tick; a field NVML refused is None ("unknown")."""

    t: float
    index: int
    uuid: str | None
    name: str | None
    memory_used: int | None
    memory_total: int | None
    util_gpu: int | None          # percent
    util_memory: int | None       # percent
    pcie_tx_bps: float | None     # bytes per second, GPU -> host
    pcie_rx_bps: float | None     # bytes per second, host -> GPU
    power_w: float | None
    processes: tuple[GpuProcess, ...] | None
    util_compute: float | None = None   # percent of the time a kernel ran (GPM; copies excluded)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted({p.rank for p in self.processes or () if p.rank is not None}))


@dataclass(frozen=True)
class ProbeRun:
    """One run of one probe: whether it worked, how long it took, and how many bad samples it
    skipped (a RANK that is no rank number, a state file that is not an agent's)."""

    probe: str
    t: float
    ok: bool
    seconds: float
    error: str = ""
    skipped: int = 0


@dataclass(frozen=True)
class Tick:
    """Everything the probes saw at one tick (the sidecar's sampler makes it, the histories and
    the store keep it)."""

    t: float
    host: dict[int, HostSample]
    node: HostMemory | None
    gpus: tuple[GpuSample, ...]
    agents: dict[int, AgentSnapshot]
    probes: tuple[ProbeRun, ...] = field(default=())


@dataclass(frozen=True)
class Frame:
    function: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.filename}:{self.line})"


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python frames, innermost first."""

    thread_id: int
    name: str | None
    active: bool
    owns_gil: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class RankStacks:
    """All Python threads of a rank at one moment, and how they were obtained."""

    rank: int
    pid: int
    t: float
    method: str                 # "py-spy", "py-spy-nonblocking", "faulthandler", "none"
    threads: tuple[ThreadStack, ...]
    error: str = ""

    @property
    def main(self) -> ThreadStack | None:
        return main_thread(self.pid, self.threads)


# Where a worker process's main thread idles, waiting for its next task, while the work it was
# given runs on a thread of its own (Ray Train runs the training loop in a TrainingThread): the
# innermost frame's function and the end of its file.
IDLE_LOOPS = (("main_loop", "/ray/_private/worker.py"),)
_STDLIB = re.compile(r"/lib/python\d\.\d+/")


def main_thread(pid: int, threads: tuple[ThreadStack, ...]) -> ThreadStack | None:
    """The thread a rank's work runs on: its main thread (the os thread id is the pid; py-spy
    lists it first), unless that idles in a worker's task loop (``IDLE_LOOPS``) while another
    thread runs code of the job's own (not the standard library's, not an installed
    package's); then that thread, the one with the most such frames."""
    main = next((t for t in threads if t.thread_id == pid), threads[0] if threads else None)
    if main is None or not idles_in_task_loop(main):
        return main
    return max(threads, key=lambda t: (_own_frames(t), t is main))


def idles_in_task_loop(thread: ThreadStack) -> bool:
    """The thread waits in a worker's task loop for its next task (``IDLE_LOOPS``)."""
    if not thread.frames:
        return False
    top = thread.frames[0]
    return any(top.function.rsplit(".", 1)[-1] == name and top.filename.endswith(path)
               for name, path in IDLE_LOOPS)


def _own_frames(thread: ThreadStack) -> int:
    """How many of a thread's frames are in the job's own files."""
    return sum(1 for f in thread.frames if not (
        "site-packages" in f.filename or "dist-packages" in f.filename
        or _STDLIB.search(f.filename) or f.filename.startswith("<")
        or "/stalldoc/agent/" in f.filename))   # the agent's own heartbeat thread


@dataclass(frozen=True)
class RankExit:
    """A rank that ended: how, and when we saw it."""

    rank: int
    pid: int
    t: float
    exit_code: int | None       # shell convention: 128+N for signal N; None if unknown
    signal: int | None
    source: str                 # "waitpid", "proc", "launcher-log", "agent", "unknown"


@dataclass(frozen=True)
class RankWork:
    """One rank's evidence of work at one tick, and the verdict drawn from it.

    ``verdict`` is "work" (the rank is doing something: it is slow, not stuck), "idle" (nothing
    seen, or CPU spent spinning inside a wait) or "pending" (busy on the CPU or GPU, its stack not
    classified yet: never counted as stuck)."""

    t: float
    verdict: str
    reason: str                      # "collectives moved", "reading 4.0 MB/s", "waiting: queue"...
    progressed: bool                 # markers, collectives, CUDA markers or progress lines moved
    cpu_percent: float | None
    children: int
    children_cpu_percent: float | None
    io_bps: float | None             # this tick's (the reason gives the recent average)
    gpu_util: int | None
    stack_kind: str                  # "working", "waiting: <why>", "" (not sampled)
    frame: str = ""                  # the user frame of the last classified stack
    since_progress: float = 0.0      # seconds since markers / collectives / lines last moved
    busy_unchanged: float = 0.0      # seconds busy in one working stack with nothing else moving
    cpu_wait_percent: float | None = None   # runnable, waiting for a CPU (% of one core)

    @property
    def working(self) -> bool:
        return self.verdict == "work"

    def describe(self) -> str:
        """'cpu 98%, io 4.0 MB/s, 2 children at 190%, gpu 0%, stack working' for evidence; a rank
        that waited for a CPU says so: 'cpu 4% (waiting for a CPU 61%)'."""
        cpu = f"cpu {_pct(self.cpu_percent)}"
        if (self.cpu_wait_percent or 0.0) >= 1.0:
            cpu += f" (waiting for a CPU {_pct(self.cpu_wait_percent)})"
        parts = [cpu, f"io {_rate(self.io_bps)}"]
        if self.children:
            parts.append(f"{self.children} children at {_pct(self.children_cpu_percent)}")
        if self.gpu_util is not None:
            parts.append(f"gpu {self.gpu_util}%")
        parts.append(f"stack {self.stack_kind or 'not sampled'}")
        return ", ".join(parts)


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def _rate(bps: float | None) -> str:
    if bps is None:
        return "?"
    return f"{bps / 1e6:.1f} MB/s" if bps >= 1e5 else f"{bps / 1e3:.0f} kB/s"


@dataclass(frozen=True)
class StallEpisode:
    """No rank made progress from ``started_at``; seen as a stall at ``detected_at``."""

    id: int
    started_at: float
    detected_at: float
    threshold: float
    ranks: tuple[int, ...]
    ended_at: float | None = None
    phases: Mapping[int, str] = field(default_factory=dict)   # rank -> phase stack when detected
    work: Mapping[int, RankWork] = field(default_factory=dict)  # rank -> what was seen at detection


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    ranks: tuple[int, ...]
    summary: str
    evidence: Mapping[str, Any]
    fix: str


@dataclass(frozen=True)
class LogLine:
    """One line the job printed."""

    t: float
    stream: str
    text: str


@dataclass(frozen=True)
class FlightEntry:
    """One entry of a rank's PyTorch Flight Recorder: a collective (or p2p op) of a group."""

    group: str                       # the process group's name ("0" for the world)
    group_desc: str                  # "default_pg", or what new_group was given
    seq: int                         # collective_seq_id (p2p_seq_id for p2p ops)
    p2p: bool
    op: str                          # profiling_name, e.g. "gloo:all_reduce", "nccl:all_gather"
    state: str                       # scheduled / started / completed
    retired: bool                    # the work finished (gloo never says "completed")
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    frames: tuple[Frame, ...] = ()   # Python frames where it was issued, innermost first

    @property
    def pending(self) -> bool:
        return not self.retired and self.state != "completed"


@dataclass(frozen=True)
class FlightDump:
    """One rank's Flight Recorder dump, as read from ``<run dir>/flight/rank_<rank>``."""

    rank: int
    path: str
    groups: Mapping[str, tuple[int, ...]]   # group name -> its global ranks (pg_config)
    entries: tuple[FlightEntry, ...]


# What a rank's agent wrote in its state file (decoded by agent/state_reader.py).

@dataclass(frozen=True)
class CollectiveRecord:
    """One collective call as a rank saw it."""

    group: str
    seq: int
    op: str
    numel: int
    dtype: str
    entered_at: float
    completed_at: float | None
    is_async: bool

    @property
    def completed(self) -> bool:
        return self.completed_at is not None


@dataclass(frozen=True)
class PhaseRecord:
    """A completed phase: its name and when it started and ended."""

    name: str
    started_at: float
    ended_at: float

    @property
    def duration(self) -> float:
        return self.ended_at - self.started_at


@dataclass(frozen=True)
class GroupState:
    """A process group's counters and the newest collectives in it (oldest first)."""

    name: str
    started: int
    completed: int
    ring: tuple[CollectiveRecord, ...]
    # collectives of the group never read: overwritten in the agent's ring before the watcher's
    # next read (counted from its first read of the ring on; 0 for a one-shot read)
    wrapped: int = 0


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


# What the command line, the node and the files say before launch (launch/).

@dataclass(frozen=True)
class LaunchConfig:
    """What the watched command line and its environment say (read by launch/config.py; its
    numbers are read and checked by ``launch.config.number``)."""

    launcher: str               # swift / torchrun / deepspeed / accelerate / python / other
    program: str                                    # the training script or module
    swift_command: str | None                       # rlhf, sft, rollout, ... (None: not swift)
    args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    nproc_per_node: int | None = None
    nnodes: int | None = None
    error: str = ""             # why part of the command could not be read or used (one line)

    def value(self, name: str) -> str | None:
        values = self.args.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        """A boolean flag: given bare or with true/1/yes/on."""
        values = self.args.get(name)
        return values is not None and (not values or values[-1].lower() in _TRUE)

    @property
    def is_grpo(self) -> bool:
        return self.swift_command == "rlhf" and (self.value("rlhf_type") or "") == "grpo"

    @property
    def world_size(self) -> int | None:
        if self.nproc_per_node is None:
            return None
        return self.nproc_per_node * (self.nnodes or 1)


@dataclass(frozen=True)
class ModelInfo:
    """Sizes read from a local model directory's config.json."""

    params: int                  # estimated parameter count
    layers: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int | None
    dtype_bytes: int             # of the weights as they will be loaded

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Resources:
    gpus: int | None = None
    gpu_memory: int | None = None        # bytes per GPU
    dataset_size: int | None = None      # rows of the training dataset(s)
    dataset_note: str = ""               # where dataset_size came from, or why it is unknown
    model: ModelInfo | None = None
    model_note: str = ""                 # where model came from, or why it is unknown


# Other nodes of a multi-node job, from the summaries their watchers publish (cluster/).

@dataclass(frozen=True)
class RemoteRank:
    """A rank of another node as its watcher last published it."""

    rank: int
    node: str                       # the node's label: "node 1"
    pid: int
    phase: str
    verdict: str                    # work / pending / idle (detect.work)
    work_age: float                 # seconds since it last showed work, when published
    progress_age: float             # seconds since its counters last moved, when published
    dead: bool
    frame: str                      # its main thread's frame outside libraries ('' unknown)
    stack_kind: str                 # working / waiting kind of that stack ('' unknown)
    groups: tuple[GroupState, ...]  # each group's counters and its pending collective


@dataclass(frozen=True)
class PeerNode:
    """Another node's watcher, as this one last read it."""

    name: str                       # its subdirectory: "node-1"
    label: str                      # "node 1"
    host: str
    state: str                      # running / ended
    silent_for: float               # seconds its summary was seen unchanged, on our clock
    lost: bool                      # silent longer than the cluster's lost_after
    seen_ago: float                 # seconds since we first read its current summary
    stall_id: int | None            # its stall going on, if any
    stall_stacks: bool              # it took its ranks' stacks for that stall
    ranks: tuple[RemoteRank, ...]


@dataclass(frozen=True)
class ClusterView:
    """This node among the job's nodes. ``shared``: the nodes' watchers share a run directory
    (else only the world size says that ranks live elsewhere)."""

    node: str                       # this node's label
    shared: bool
    nnodes: int | None
    world_size: int | None
    peers: tuple[PeerNode, ...] = ()
    never_seen: tuple[str, ...] = ()   # expected nodes that published nothing yet
    lost_after: float = 30.0

    def remote(self) -> dict[int, RemoteRank]:
        """Every other node's ranks by global rank (lost nodes' as last published)."""
        return {r.rank: r for peer in self.peers for r in peer.ranks}

    def lost(self) -> tuple[PeerNode, ...]:
        return tuple(p for p in self.peers if p.lost and p.state != "ended")

    def node_of(self, rank: int) -> PeerNode | None:
        return next((p for p in self.peers if any(r.rank == rank for r in p.ranks)), None)


@dataclass(frozen=True)
class Window:
    """What the rules see: the latest view of every rank at the moment of a check."""

    now: float
    ranks: tuple[RankProcess, ...]
    agents: Mapping[int, AgentSnapshot] = field(default_factory=dict)
    host: Mapping[int, tuple[HostSample, ...]] = field(default_factory=dict)
    stacks: Mapping[int, RankStacks] = field(default_factory=dict)
    exits: tuple[RankExit, ...] = ()
    stall: StallEpisode | None = None
    last_progress: Mapping[int, float] = field(default_factory=dict)
    log_tail: tuple[str, ...] = ()
    gpus: Mapping[int, tuple[GpuSample, ...]] = field(default_factory=dict)   # recent, per GPU
    node: tuple[HostMemory, ...] = ()                                         # recent
    log: tuple[LogLine, ...] = ()        # lines not seen by the rules before (tick) / recent
    peers: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # TCP peers outside the job
    cuda: Mapping[int, tuple[tuple[float, CudaState], ...]] = field(default_factory=dict)  # recent
    config: LaunchConfig | None = None       # what the command line and environment say
    resources: Resources | None = None       # GPUs, their memory, dataset size (launch rules)
    work: Mapping[int, RankWork] = field(default_factory=dict)   # each live rank's latest verdict
    busy_timeout: float = 600.0              # busy in one stack this long: a possible livelock
    floor: float = 45.0                      # the stall timeout: slow counts from there
    vllm_sleep: tuple[EngineSleepState, ...] = ()   # engines' sleep state from their log lines
    flight: Mapping[int, FlightDump] = field(default_factory=dict)   # rank -> its FR dump (stall)
    cluster: ClusterView | None = None      # the job's other nodes (multi-node jobs only)
