"""Agent probe: read the state file of every rank that has one. A file that is not an agent's
(damaged, foreign, crafted: a FIFO, a directory, a link, a name that is no pid) is skipped and
counted; it never stops the watcher nor makes it wait."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Iterable

import psutil

from stalldoc.agent.statefile import finished_path, read_finished, state_path
from stalldoc.agent.versions import versions_path
from stalldoc.agent.state_reader import (IncrementalReader, StateFileError, read_claim,
                                         read_markers, read_started_at, read_state)
from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.ranks import RankClaim, RankProcess


PID_LIMIT = 2**22   # pids are below this (the kernel's PID_MAX_LIMIT)


@dataclass(frozen=True)
class AgentRead:
    """The ranks' agent states at one tick, and how many files were skipped as not an agent's
    (ranks' files refused, and names in the directory that name no process)."""

    states: dict[int, AgentSnapshot]
    skipped: int = 0


class AgentStateProbe:
    name = "agent"

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self._odd_names = 0    # at the last listing of the directory
        self._files = IncrementalReader()   # each rank's rings: only new entries are decoded
        self._others = IncrementalReader()  # processes of the job that are not ranks

    def pids_with_state(self) -> set[int]:
        """Processes that started an agent (whether or not they are ranks)."""
        if not self.directory or not os.path.isdir(self.directory):
            return set()
        pids, odd = set(), 0
        for name in os.listdir(self.directory):
            if name.startswith("agent-") and name.endswith(".state"):
                pid = state_pid(name)
                if pid is None:
                    odd += 1
                else:
                    pids.add(pid)
        self._odd_names = odd
        return pids

    def claims(self, pids: Iterable[int]) -> tuple[dict[int, RankClaim], int]:
        """The rank each of ``pids`` claims through its agent (``agent/identity.py``), and how
        many files were refused as not an agent's. A process without an agent, or whose agent
        claims nothing, is left out."""
        if not self.directory:
            return {}, 0
        out, refused = {}, 0
        for pid in pids:
            try:
                claim = read_claim(state_path(self.directory, pid))
            except StateFileError:
                refused += 1
                continue
            except OSError:
                continue
            if claim is not None:
                out[pid] = claim
        return out, refused

    def markers(self, pids: Iterable[int]) -> dict[int, int]:
        """pid -> how many progress markers its agent counted; pids without a readable agent
        file are left out (the header only: a few bytes per process)."""
        if not self.directory:
            return {}
        counts = {pid: read_markers(state_path(self.directory, pid)) for pid in pids}
        return {pid: count for pid, count in counts.items() if count is not None}

    def of_pids(self, pids: Iterable[int]) -> dict[int, AgentSnapshot]:
        """pid -> its agent's state, for processes that are not ranks (a vLLM engine core):
        those without a readable agent file are left out."""
        if not self.directory:
            return {}
        out, paths = {}, {pid: state_path(self.directory, pid) for pid in pids}
        for pid, path in paths.items():
            try:
                out[pid] = self._others.read(path)
            except (StateFileError, OSError):
                continue
        self._others.keep_only(set(paths.values()))
        return out

    def read(self, ranks: list[RankProcess]) -> AgentRead:
        """Rank → its agent's state; ranks without a state file (not yet, or no agent) are left
        out, and so are those whose file is not an agent's (counted)."""
        if not self.directory:
            return AgentRead({})
        out, refused = {}, 0
        paths = [(rank.rank, state_path(self.directory, rank.pid)) for rank in ranks]
        worlds = _worlds(ranks)
        for rank, path in paths:
            try:
                out[rank] = _in_world(self._files.read(path), worlds.get(rank))
            except StateFileError:
                refused += 1
            except OSError:
                continue
        self._files.keep_only({path for _, path in paths})
        return AgentRead(out, refused + self._odd_names)

    def sample(self, ranks: list[RankProcess]) -> dict[int, AgentSnapshot]:
        """Rank → its agent's state (``read`` without the count)."""
        return self.read(ranks).states

    def finished(self, ranks: list[RankProcess]) -> dict[int, float]:
        """Rank → when its script returned, for the ranks whose agents said so."""
        if not self.directory:
            return {}
        return {r.rank: t for r in ranks
                if (t := read_finished(self.directory, r.pid)) is not None}

    def sweep(self, keep: set[int], costs: StartupCosts) -> int:
        """Delete the files of agents whose process ended (or whose pid now belongs to another
        process) and that were never ranks (``keep``): short-lived Python processes (one per
        reward sample, say) must not grow the directory or the per-tick scan. Their start-up
        cost goes to ``costs`` first. Returns how many were removed."""
        if not self.directory:
            return 0
        removed = 0
        for pid in self.pids_with_state() - keep:
            path = state_path(self.directory, pid)
            if _still_running(pid, read_started_at(path)):
                continue
            try:
                identity = read_state(path).identity
            except (OSError, StateFileError):
                identity = None
            if identity is not None:
                costs.add(identity.startup_seconds)
            for name in (path, os.path.join(self.directory, f"faulthandler-{pid}.txt"),
                         finished_path(self.directory, pid),
                         os.path.join(self.directory, f"flight-{pid}"),
                         versions_path(self.directory, pid),
                         versions_path(self.directory, pid) + ".tmp"):
                try:
                    os.unlink(name)
                except OSError:
                    pass
            removed += 1
        return removed


def _worlds(ranks: list[RankProcess]) -> dict[int, str]:
    """Rank -> its world, in a job of several torch.distributed worlds (none otherwise)."""
    return {r.rank: r.world for r in ranks if r.world_rank is not None and r.world}


def _in_world(agent: AgentSnapshot, world: str | None) -> AgentSnapshot:
    """The snapshot with its process groups named with their world (``world@10.0.0.1:29500``):
    every world has a group "world" and groups "1", "2"..., collectives are aligned by group
    name, and two worlds must never share one."""
    if world is None:
        return agent
    return dataclasses.replace(agent, groups=tuple(
        dataclasses.replace(g, name=f"{g.name}@{world}") for g in agent.groups))


def state_pid(name: str) -> int | None:
    """The pid in a state file's name (``agent-PID.state``); None when it names no process."""
    digits = name[len("agent-"):-len(".state")]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 7:
        return None
    pid = int(digits)
    return pid if 0 < pid < PID_LIMIT else None


def _still_running(pid: int, agent_started: float | None) -> bool:
    """The process that wrote the file is alive, not a later process that got its pid. A file
    not readable yet (its agent is starting) belongs to the live process of that pid."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    return agent_started is None or created <= agent_started + 1.0


@dataclass
class StartupCosts:
    """The agent's start-up cost per Python process, as seen in state files."""

    seconds: list[float] = field(default_factory=list)
    limit: int = 10000

    def add(self, value: float) -> None:
        if value > 0 and len(self.seconds) < self.limit:
            self.seconds.append(value)

    def summary(self) -> dict[str, float | int] | None:
        if not self.seconds:
            return None
        ordered = sorted(self.seconds)
        pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)  # noqa: E731
        return {"processes": len(ordered), "median_ms": pick(0.5), "p90_ms": pick(0.9),
                "max_ms": round(ordered[-1] * 1000, 2)}
