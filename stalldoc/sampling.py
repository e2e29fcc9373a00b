"""One tick of the sidecar probes: host, node, NVML and agent state, each timed.

The probes are run one after another; each returns what it could and publishes a ProbeRun (did it
work, how long it took, why not). A probe that raises is recorded as failed for that tick and the
others still run. GPU processes are mapped to ranks through the job's process tree, so a vLLM
worker or any child of a rank counts for that rank.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from stalldoc.agent.state_reader import AgentSnapshot
from stalldoc.model import GpuSample, HostMemory, HostSample, ProbeRun, RankProcess
from stalldoc.probes.agent_state import AgentStateProbe
from stalldoc.probes.host import HostProbe
from stalldoc.probes.nvml import NvmlProbe

T = TypeVar("T")


@dataclass(frozen=True)
class Tick:
    """Everything the probes saw at one tick."""

    t: float
    host: dict[int, HostSample]
    node: HostMemory | None
    gpus: tuple[GpuSample, ...]
    agents: dict[int, AgentSnapshot]
    probes: tuple[ProbeRun, ...] = field(default=())


def rank_of(pid: int, rank_pids: Mapping[int, int], parents: Mapping[int, int]) -> int | None:
    """The rank whose process tree holds ``pid`` (the rank itself or any descendant)."""
    seen = 0
    while pid and seen < 64:
        if pid in rank_pids:
            return rank_pids[pid]
        pid = parents.get(pid, 0)
        seen += 1
    return None


def attribute(gpus: list[GpuSample], rank_pids: Mapping[int, int],
              parents: Mapping[int, int]) -> tuple[GpuSample, ...]:
    """Fill in the rank of every GPU process that belongs to the job."""
    return tuple(
        dataclasses.replace(gpu, processes=tuple(
            dataclasses.replace(p, rank=rank_of(p.pid, rank_pids, parents))
            for p in gpu.processes)) if gpu.processes else gpu
        for gpu in gpus)


class Sampler:
    """Runs the probes of one tick."""

    def __init__(self, agent_dir: str | None, gpus: bool = True) -> None:
        self.host = HostProbe()
        self.agents = AgentStateProbe(agent_dir)
        self.nvml = NvmlProbe()
        self.unavailable = {"nvml": self.nvml.start() if gpus else "turned off (--no-gpu)"}
        self.gpus_on = not self.unavailable["nvml"]
        if self.gpus_on:
            del self.unavailable["nvml"]

    def sample(self, now: float, live: list[RankProcess], known: list[RankProcess],
               parents: Mapping[int, int]) -> Tick:
        runs: list[ProbeRun] = []
        host = self._timed(runs, "host", lambda: self.host.sample(now, live, parents), [])
        node = self._timed(runs, "node", lambda: self.host.node(now), None)
        gpus: list[GpuSample] = (self._timed(runs, "nvml", lambda: self.nvml.sample(now), [])
                                 if self.gpus_on else [])
        agents = self._timed(runs, "agent", lambda: self.agents.sample(known), {})
        rank_pids = {r.pid: r.rank for r in known}
        return Tick(now, {s.rank: s for s in host}, node, attribute(gpus, rank_pids, parents),
                    agents, tuple(runs))

    @staticmethod
    def _timed(runs: list[ProbeRun], name: str, fn: Callable[[], T], default: Any) -> T:
        started = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - one probe's failure never stops a tick
            runs.append(ProbeRun(name, time.time(), False, time.perf_counter() - started,
                                 f"{type(exc).__name__}: {exc}"))
            return default
        runs.append(ProbeRun(name, time.time(), True, time.perf_counter() - started))
        return value

    def close(self) -> None:
        self.nvml.stop()
