"""What a run directory holds, as frozen records: the one typed view every report format reads.

``read.py`` builds them from a run database of any readable schema version; ``document.py``
turns them into the JSON contract of ``stalldoc report --format json``. Times are wall-clock
seconds since the epoch, as each node's watcher saw them, so runs of several nodes share one axis.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from stalldoc.model.stacks import ThreadStack, main_thread


@dataclass(frozen=True)
class RunInfo:
    """The run itself: the command, where and when, how it ended, what stalldoc set up."""

    id: str
    command: tuple[str, ...]          # redacted when stored
    node: str                         # the host name
    started_at: float | None
    ended_at: float | None
    exit_code: int | None             # the job's own (128+N: killed by signal N)
    stall_timeout: float | None
    agent: bool
    schema_version: int
    agent_startup: Mapping[str, Any] | None = None
    dropped_log_lines: int = 0
    pruned_log_lines: int = 0
    pruned_stall_stacks: int = 0
    journal_mode: str = "wal"
    tick_errors: int = 0
    dropped_collectives: int = 0      # collective calls past the store's cap per rank and tick
    flight_recorder: Mapping[str, Any] | None = None
    watch_exit_code: int | None = None   # stalldoc watch's own exit status
    ended_by: str | None = None          # "job", "stalldoc" (--on-stall kill), "interrupt"
    on_stall: str | None = None          # "observe" or "kill"
    versions: Mapping[str, str] = field(default_factory=dict)   # library -> version, at launch
    launch: Mapping[str, Any] | None = None   # the launch checks' plan, resources and skips
    cluster: Mapping[str, Any] | None = None  # node, label, index, nnodes, shared_dir (multi-node)
    attached: Mapping[str, Any] | None = None  # stalldoc attach: pids, window, job_ended ...
    attempt: Mapping[str, Any] | None = None   # a requeue into the run directory: its attempt,
    #                                            the earlier runs' subdirectories ("earlier")
    # stalldoc logs: each file read (path, rank, local_rank, lines, stamped, first_at, last_at,
    # ranks, local_ranks)
    logs_read: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class RankRecord:
    """One process that was a rank (a rank restarted under a new pid is a second record)."""

    rank: int
    pid: int
    local_rank: int | None
    cmdline: tuple[str, ...]
    first_seen: float
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    exit_source: str | None = None
    node: str = ""
    source: str | None = None     # how it was known to be a rank (schema 6; None before)
    world: str | None = None      # its torch.distributed world, where known
    world_rank: int | None = None  # its rank in that world, when ``rank`` numbers several


@dataclass(frozen=True)
class StallRecord:
    """A stall: no rank showed work from ``started_at``; ``phases`` and ``work`` are keyed by
    the rank as text (the JSON contract's keys)."""

    id: int
    started_at: float
    detected_at: float
    ended_at: float | None
    threshold: float
    ranks: tuple[int, ...]
    phases: Mapping[str, str] = field(default_factory=dict)
    work: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    node: str = ""


@dataclass(frozen=True)
class FindingRecord:
    """A stored finding and its life: opened at ``t`` by ``trigger``, last seen at
    ``updated_at``, resolved at ``resolved_at`` (None: it still held when the run ended)."""

    id: int
    t: float
    stall_id: int | None
    code: str
    name: str
    severity: str
    ranks: tuple[int, ...]
    summary: str
    evidence: Mapping[str, Any]
    fix: str
    trigger: str = "stall"
    updated_at: float | None = None
    resolved_at: float | None = None
    occurrences: int = 1
    node: str = ""
    state: str = "open"              # "open" until resolved_at, then "resolved" (the ledger's)


@dataclass(frozen=True)
class StackRecord:
    """All Python threads of one rank, taken at a stall (``method``: how; ``error``: why not
    py-spy)."""

    stall_id: int | None
    rank: int
    pid: int
    t: float
    method: str
    error: str
    threads: tuple[ThreadStack, ...]
    node: str = ""

    @property
    def main(self) -> ThreadStack | None:
        return main_thread(self.pid, self.threads)


@dataclass(frozen=True)
class PhaseStats:
    """Durations of one phase name over all ranks, in seconds."""

    count: int
    median: float
    p95: float
    max: float


@dataclass(frozen=True)
class HostSummary:
    min_available_bytes: int | None = None
    total_bytes: int | None = None
    peak_swap_in_bps: float | None = None
    peak_swap_out_bps: float | None = None
    peak_load1: float | None = None
    cores: int | None = None


@dataclass(frozen=True)
class GpuSummary:
    gpu: int
    uuid: str | None = None
    name: str | None = None
    memory_total: int | None = None
    peak_memory_used: int | None = None
    util_gpu_mean: float | None = None
    max_processes: int | None = None
    util_compute_mean: float | None = None     # schema 7, GPM: kernels only
    peak_power_w: float | None = None
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuPhase:
    """PCIe bytes and mean utilisation of the GPUs while their rank was in ``phase``."""

    phase: str
    gpu_seconds: float | None = None
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    util_gpu_mean: float | None = None
    util_compute_mean: float | None = None     # schema 7, GPM: kernels only


@dataclass(frozen=True)
class Watermark:
    """Memory peaks of a rank over the run (``phase`` None) or within one phase."""

    rank: int
    peak_rss_bytes: int | None = None
    peak_gpu_memory_bytes: int | None = None
    peak_cuda_allocated_bytes: int | None = None
    peak_cuda_reserved_bytes: int | None = None
    cuda_alloc_retries: int | None = None
    cuda_ooms: int | None = None
    phase: str | None = None


@dataclass(frozen=True)
class ProbeHealth:
    probe: str
    available: bool
    unavailable: str
    runs: int
    failures: int
    skipped: int
    mean_seconds: float | None
    max_seconds: float | None
    last_error: str


@dataclass(frozen=True)
class RankPoint:
    """One rank at one tick (thinned over long runs)."""

    t: float
    rank: int
    status: str | None = None
    phase: str | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    cuda_host_marker: int | None = None
    cuda_gpu_marker: int | None = None


@dataclass(frozen=True)
class GpuPoint:
    t: float
    gpu: int
    uuid: str | None = None
    name: str | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    util_gpu: int | None = None
    util_memory: int | None = None
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    power_w: float | None = None
    processes: int | None = None
    ranks: tuple[int, ...] = ()
    phase: str | None = None
    util_compute: float | None = None          # schema 7, GPM: kernels only


@dataclass(frozen=True)
class NodePoint:
    t: float
    available_bytes: int | None = None
    total_bytes: int | None = None
    swap_in_bps: float | None = None
    swap_out_bps: float | None = None
    load1: float | None = None
    cores: int | None = None


@dataclass(frozen=True)
class PhaseSpan:
    """One ended phase of one rank (kept at full resolution around stalls and findings)."""

    rank: int
    name: str
    started_at: float
    ended_at: float


@dataclass(frozen=True)
class CollectiveSpan:
    """One collective call of one rank as its agent's ring held it (``completed_at`` None: it
    had not completed when last read)."""

    rank: int
    group: str
    seq: int
    op: str
    numel: int
    dtype: str
    entered_at: float
    completed_at: float | None


@dataclass(frozen=True)
class TimeSeries:
    ranks: tuple[RankPoint, ...] = ()
    gpus: tuple[GpuPoint, ...] = ()
    node: tuple[NodePoint, ...] = ()


@dataclass(frozen=True)
class StepShareRecord:
    """Where a rank's cycles went (``analysis/phase_shares.py``): over ``run`` (every complete
    cycle but the first) or ``last`` (the last 3), each kind's share of the time."""

    rank: int
    over: str
    cycle: str                     # the kind of phase that starts each cycle
    cycles: int
    cycle_seconds: float
    shares: Mapping[str, float]    # train, rollout, generate, reward, weight_sync, offload,
                                   # waiting, other: summing to 1
    weight_sync_calls_per_cycle: float


@dataclass(frozen=True)
class RunRecord:
    """One node's run directory, read whole."""

    path: str
    node: str                       # its label in a report of several nodes
    info: RunInfo
    ranks: tuple[RankRecord, ...]
    stalls: tuple[StallRecord, ...]
    findings: tuple[FindingRecord, ...]
    stacks: tuple[StackRecord, ...]
    phases: Mapping[str, PhaseStats]
    host: HostSummary
    gpus: tuple[GpuSummary, ...]
    gpu_phases: tuple[GpuPhase, ...]
    watermarks: tuple[Watermark, ...]          # per run (phase None) and per phase
    probes: tuple[ProbeHealth, ...]
    timeseries: TimeSeries
    spans: tuple[PhaseSpan, ...] = ()
    collectives: tuple[CollectiveSpan, ...] = ()   # schema 5 on (table ``collectives``)
    flight_dumps: tuple[str, ...] = ()
    step_shares: tuple[StepShareRecord, ...] = ()   # schema 8 on (table ``phase_kinds``)


@dataclass(frozen=True)
class Report:
    """What ``stalldoc report`` shows: one run, or the runs of several nodes of one job merged
    (global ranks as the launcher numbered them, one wall-clock axis)."""

    runs: tuple[RunRecord, ...]

    @property
    def merged(self) -> bool:
        return len(self.runs) > 1

    @property
    def started_at(self) -> float:
        return min((r.info.started_at for r in self.runs if r.info.started_at), default=0.0)

    @property
    def ranks(self) -> tuple[RankRecord, ...]:
        return tuple(sorted((x for r in self.runs for x in r.ranks),
                            key=lambda x: (x.rank, x.first_seen)))

    @property
    def stalls(self) -> tuple[StallRecord, ...]:
        return tuple(sorted((x for r in self.runs for x in r.stalls),
                            key=lambda x: x.detected_at))

    @property
    def findings(self) -> tuple[FindingRecord, ...]:
        return tuple(sorted((x for r in self.runs for x in r.findings), key=lambda x: x.t))

    @property
    def stacks(self) -> tuple[StackRecord, ...]:
        return tuple(sorted((x for r in self.runs for x in r.stacks), key=lambda x: (x.t, x.rank)))


def node_title(node: str) -> str:
    """'node gpu-07' for a host-named node, 'node 1' as it is for a multi-node job's node."""
    return node if node.startswith("node ") else f"node {node}"
