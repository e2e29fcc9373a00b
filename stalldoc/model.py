"""Data passed between the parts of the watcher: frozen dataclasses, nothing else."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from stalldoc.agent.state_reader import AgentSnapshot, CudaState, EngineSleepState
from stalldoc.launch.config import LaunchConfig
from stalldoc.launch.resources import Resources


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
    from_env: bool = True   # found by RANK in its environment (False: the single-process rank 0)


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
        """The main thread (py-spy lists it first: its os thread id is the pid)."""
        for thread in self.threads:
            if thread.thread_id == self.pid:
                return thread
        return self.threads[0] if self.threads else None


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

    @property
    def working(self) -> bool:
        return self.verdict == "work"

    def describe(self) -> str:
        """'cpu 98%, io 4.0 MB/s, 2 children at 190%, gpu 0%, stack working' for evidence."""
        parts = [f"cpu {_pct(self.cpu_percent)}", f"io {_rate(self.io_bps)}"]
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
