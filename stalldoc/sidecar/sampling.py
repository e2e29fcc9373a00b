"""One tick of the sidecar probes: the job's processes and ranks ("procs"), host, node, NVML and
agent state, each timed.

The process table is read once per tick (``discover``); the job tree, the ranks and the host probe
all use that snapshot. The probes are run one after another; each returns what it could and
publishes a ProbeRun (did it work, how long it took, why not, how many bad samples it skipped). A
probe that raises is recorded as failed for that tick and the others still run. GPU processes are
mapped to ranks through the job's process tree, so a vLLM worker or any child of a rank counts for
that rank.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, TypeVar

from stalldoc.run.job import JobTree
from stalldoc.model.ranks import EngineProcess, RankProcess
from stalldoc.model.samples import GpuSample, HostSample, ProbeRun, Tick
from stalldoc.probes.agent_state import AgentRead, AgentStateProbe
from stalldoc.probes.host import HostProbe, rank_of
from stalldoc.probes.nvml import NvmlProbe
from stalldoc.probes.proc_table import ProcessTable, scan
from stalldoc.probes.process_tree import Found, RankFinder
from stalldoc.probes.ray_state import drivers

T = TypeVar("T")


@dataclass(frozen=True)
class Discovery:
    """The job's processes at one tick, from one scan of the process table, and its ranks."""

    table: ProcessTable | None      # None when the scan failed (``run`` says why)
    pids: tuple[int, ...]           # the job's processes, its command first
    ranks: tuple[RankProcess, ...]
    run: ProbeRun
    engines: tuple[EngineProcess, ...] = ()   # vLLM engines' processes (the ranks' work)
    claimed: frozenset[int] = frozenset()     # the processes whose agent claims a rank

    @property
    def parents(self) -> dict[int, int]:
        """pid -> parent pid, for the job's processes."""
        return {pid: self.table.ppid(pid) for pid in self.pids} if self.table else {}


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
        self.finder = RankFinder()
        self.nvml = NvmlProbe()
        self.unavailable = {"nvml": self.nvml.start() if gpus else "turned off (--no-gpu)"}
        self.gpus_on = not self.unavailable["nvml"]
        if self.gpus_on:
            del self.unavailable["nvml"]

    def discover(self, job: JobTree, exclude: int | None, single: bool) -> Discovery:
        """The job's processes and ranks now, from one scan of the process table. ``single``:
        with no RANK anywhere, take the job for a single process (its rank 0)."""
        runs: list[ProbeRun] = []
        table, pids, found, claimed = self._timed(
            runs, "procs", lambda: self._find(job, exclude, single),
            (None, (), Found(()), frozenset()), lambda seen: seen[2].skipped + seen[0].skipped)
        return Discovery(table, pids, found.ranks, runs[0], found.engines, claimed)

    def _find(self, job: JobTree, exclude: int | None, single: bool
              ) -> tuple[ProcessTable, tuple[int, ...], Found, frozenset[int]]:
        table = scan()
        pids = tuple(job.pids(table, exclude))
        agents = self.agents.pids_with_state()
        claims, refused = self.agents.claims(pid for pid in pids if pid in agents)
        found = self.finder.find(table, pids, agents, single, root=job.roots, claims=claims,
                                 ray_drivers=drivers(self.agents.directory, pids))
        return (table, pids, dataclasses.replace(found, skipped=found.skipped + refused),
                frozenset(claims))

    def sample(self, now: float, live: list[RankProcess], known: list[RankProcess],
               parents: Mapping[int, int], found: Discovery | None = None,
               apart: Iterable[int] = ()) -> Tick:
        """One tick of the probes; ``found`` is this tick's discovery (its process table is used,
        its run recorded), else the process table is read here. ``apart``: processes below
        ranks whose CPU and I/O are not their rank's work (``HostProbe.sample``)."""
        runs: list[ProbeRun] = [found.run] if found is not None else []
        table = found.table if found is not None else None
        host = self._timed(runs, "host",
                           lambda: self.host.sample(now, live, parents, table, apart), [])
        node = self._timed(runs, "node", lambda: self.host.node(now), None)
        gpus: list[GpuSample] = (self._timed(runs, "nvml", lambda: self.nvml.sample(now), [])
                                 if self.gpus_on else [])
        agents = self._timed(runs, "agent", lambda: self.agents.read(known), AgentRead({}),
                             lambda read: read.skipped).states
        rank_pids = {r.pid: r.rank for r in known}
        return Tick(now, {s.rank: s for s in host}, node, attribute(gpus, rank_pids, parents),
                    agents, tuple(runs))

    @staticmethod
    def _timed(runs: list[ProbeRun], name: str, fn: Callable[[], T], default: Any,
               skipped: Callable[[T], int] = lambda value: 0) -> T:
        started = time.perf_counter()
        try:
            value = fn()
            bad = skipped(value)
        except Exception as exc:  # noqa: BLE001 - one probe's failure never stops a tick
            runs.append(ProbeRun(name, time.time(), False, time.perf_counter() - started,
                                 f"{type(exc).__name__}: {exc}"))
            return default
        runs.append(ProbeRun(name, time.time(), True, time.perf_counter() - started,
                             skipped=bad))
        return value

    def close(self) -> None:
        self.nvml.stop()
