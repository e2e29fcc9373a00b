"""What the probes see at each tick: host and GPU samples, probe runs, log lines, and
the tick that holds them."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from stalldoc.model.agent import AgentSnapshot


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
    io_bps: float | None = None        # bytes read + written per second (rchar + wchar and
                                       # TCP bytes received + sent, the rank and its
                                       # descendants) since the previous tick
    cpu_wait_percent: float | None = None   # its threads runnable but waiting for a CPU (the
                                       # run-queue delay) since the previous tick; 100 = one
                                       # thread the whole time. None: the kernel keeps no count
    children_cpu_wait_percent: float | None = None   # its descendants' (their main threads')
    engine_cpu_percent: float | None = None   # its vLLM engines' processes (and theirs), apart
                                       # from its work once they serve; None: it has none


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
class GenerationSample:
    """One tick of a rank generating (its innermost phase of a kind is a rollout or a
    generation): the seconds since the tick before, and how busy each of its GPUs was (index,
    NVML's utilisation in percent)."""

    t: float
    seconds: float
    gpus: tuple[tuple[int, int], ...]


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


_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")   # CSI: colours, cursor moves, erasing


def words_of(text: str) -> str:
    """A line as a terminal shows its words: without its escape sequences (Ray colours its
    prefixes: ``\x1b[33m(autoscaler +5s)\x1b[0m Error: ...``)."""
    return _ESCAPES.sub("", text) if "\x1b" in text else text


@dataclass(frozen=True)
class LogLine:
    """One line the job printed."""

    t: float
    stream: str
    text: str
    rank: int | None = None     # the global rank that printed it, where known apart from its
                                # text (a saved log of one rank, read by ``stalldoc logs``)
