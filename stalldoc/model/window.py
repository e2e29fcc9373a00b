"""What the rules see at a check: the window over every part's records."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from stalldoc.model.agent import AgentSnapshot, CudaState, EngineSleepState, PhaseKinds
from stalldoc.model.cluster import ClusterView
from stalldoc.model.collectives import FlightDump
from stalldoc.model.kernel import KernelWait
from stalldoc.model.launch import LaunchConfig, Resources
from stalldoc.model.peer_watch import PeerWatch
from stalldoc.model.ray_job import JobOutside, OutsideSeen
from stalldoc.model.ranks import EnginePreemptions, EngineState, RankExit, RankProcess
from stalldoc.model.samples import GenerationSample, GpuSample, HostMemory, HostSample, LogLine
from stalldoc.model.served import JobServer, ServedRank, ServerMetrics
from stalldoc.model.stacks import BuildLock, RankStacks
from stalldoc.model.work import RankWork, StallEpisode


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
    # rank -> the system call its main thread is blocked in (stall; probes/kernel_wait.py)
    kernel: Mapping[int, KernelWait] = field(default_factory=dict)
    cluster: ClusterView | None = None      # the job's other nodes (multi-node jobs only)
    # rank -> stacks of the child processes it waits on (DataLoader workers, a pool; stall only)
    children: Mapping[int, tuple[RankStacks, ...]] = field(default_factory=dict)
    # torch C++ extension build locks in the roots of ranks that wait on one (stall only)
    build_locks: tuple[BuildLock, ...] = ()
    # the ranks' vLLM engine processes and their states (stall only)
    engines: tuple[EngineState, ...] = ()
    # ranks that serve HTTP: their URL, whether their engine waits for requests, vLLM's metrics
    served: Mapping[int, ServedRank] = field(default_factory=dict)
    # rank -> the job's own servers (below a rank, no rank) it waits on over HTTP (stall only)
    job_servers: Mapping[int, tuple[JobServer, ...]] = field(default_factory=dict)
    # host:port -> vLLM's metrics of a server a rank waits on over HTTP (stall only)
    peer_servers: Mapping[str, ServerMetrics] = field(default_factory=dict)
    # rank -> the settings of the vLLM engine its own process created (colocated; stall only)
    engine_settings: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    # rank -> the requests its vLLM engines preempted, so far and lately (every tick)
    preemptions: Mapping[int, EnginePreemptions] = field(default_factory=dict)
    # rank -> why its present process runs without stalldoc's agent (every tick)
    agentless: Mapping[int, str] = field(default_factory=dict)
    # rank -> the other watch (a rollout server's) whose job serves what the rank waits on
    # (stall only; ``cluster/peer_card.py``)
    peer_watches: Mapping[int, PeerWatch] = field(default_factory=dict)
    # rank -> when its script returned (its agent said so): what holds it is the process's end
    # (threads that are not daemons, exit handlers), not its work (stall only)
    finished: Mapping[int, float] = field(default_factory=dict)
    # where a Ray job stands when every rank waits for its next task: its driver, its actors
    # that are no rank, Ray's state of them (a stall of the job itself only)
    outside: JobOutside | None = None
    # the driver or actors busy in one unchanging stack for the busy timeout while every rank
    # waits for its next task (every tick)
    spinning: tuple[OutsideSeen, ...] = ()
    # rank -> its time by kind of phase, read near each start of its cycles (every tick)
    kinds: Mapping[int, tuple[PhaseKinds, ...]] = field(default_factory=dict)
    # rank -> its recent ticks generating, with its GPUs' utilisation then (every tick)
    generation: Mapping[int, tuple[GenerationSample, ...]] = field(default_factory=dict)
