"""The progress model: when did each rank last move forward, and is the job stalled?

A rank progresses when its agent's marker or collective counters advance, or when it is busy:
CPU time rising while its stack keeps changing (the watcher samples stacks of busy ranks that
have no marker progress, and reports them with ``stack_seen``). The job is stalled when no live
rank progressed for longer than the threshold; the threshold adapts upward for phases that have
been seen to take long.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from stalldoc.agent.statefile import AgentSnapshot
from stalldoc.detect.thresholds import PhaseDurations
from stalldoc.model import HostSample, StallEpisode

BUSY_CPU_FRACTION = 0.2   # CPU seconds per wall second above which a rank counts as busy


@dataclass
class _Rank:
    last_progress: float
    counters: tuple[int, int, int] = (0, 0, 0)
    cpu: float | None = None
    busy: bool = False
    signature: tuple | None = None
    last_stack_at: float = 0.0
    phase: str = ""
    phase_stack: str = ""


@dataclass
class ProgressTracker:
    floor: float
    ranks: dict[int, _Rank] = field(default_factory=dict)
    durations: PhaseDurations = field(default_factory=PhaseDurations)
    episode: StallEpisode | None = None
    episodes: int = 0
    dead: set[int] = field(default_factory=set)

    def observe(self, now: float, agents: Mapping[int, AgentSnapshot],
                host: Mapping[int, HostSample], interval: float) -> None:
        """Fold one tick of samples into every rank's state."""
        for rank in set(agents) | set(host):
            state = self.ranks.setdefault(rank, _Rank(now))
            agent = agents.get(rank)
            if agent is not None:
                self._observe_agent(rank, state, agent, now)
            sample = host.get(rank)
            if sample is not None:
                cpu = sample.cpu_seconds
                state.busy = (state.cpu is not None and sample.status != "stopped"
                              and cpu - state.cpu >= BUSY_CPU_FRACTION * interval)
                state.cpu = cpu

    def _observe_agent(self, rank: int, state: _Rank, agent: AgentSnapshot, now: float) -> None:
        started = sum(g.started for g in agent.groups)
        counters = (agent.marker_seq, started, agent.collective_seq)
        if counters != state.counters:
            state.counters = counters
            state.last_progress = now
        state.phase = agent.phase
        state.phase_stack = "/".join(agent.phase_stack)
        self.durations.update(rank, agent.phases_completed, agent.phases)

    def due_for_stack(self, now: float) -> list[int]:
        """Busy ranks without marker progress for a while whose stack should be sampled now."""
        start, every = self.floor / 3, self.floor / 6
        return [rank for rank, s in self.ranks.items()
                if rank not in self.dead and s.busy and now - s.last_progress >= start
                and now - s.last_stack_at >= every]

    def stack_seen(self, rank: int, signature: tuple, now: float) -> None:
        """A busy rank whose stack changed since the last sample has progressed."""
        state = self.ranks[rank]
        if state.signature is not None and signature != state.signature:
            state.last_progress = now
        state.signature = signature
        state.last_stack_at = now

    def job_progressed(self, now: float) -> None:
        """The job itself reported progress (a logged training step that every rank took part
        in): every live rank counts as progressing."""
        for rank, state in self.ranks.items():
            if rank not in self.dead:
                state.last_progress = now

    def forget(self, rank: int) -> None:
        """A new process holds this rank: start its history afresh."""
        self.ranks.pop(rank, None)
        self.dead.discard(rank)

    def mark_dead(self, rank: int) -> None:
        self.dead.add(rank)

    def live(self) -> dict[int, _Rank]:
        return {r: s for r, s in self.ranks.items() if r not in self.dead}

    def threshold(self) -> float:
        """The floor, raised for the slowest phase any live rank is in now."""
        phases = [s.phase for s in self.live().values() if s.phase]
        return max([self.floor] + [self.durations.threshold(p, self.floor) for p in phases])

    def last_progress(self) -> dict[int, float]:
        return {r: s.last_progress for r, s in self.ranks.items()}

    def check(self, now: float) -> tuple[StallEpisode | None, StallEpisode | None]:
        """(a stall that starts now, a stall that ended now): at most one is not None."""
        live = self.live()
        if not live:
            return None, None
        newest = max(s.last_progress for s in live.values())
        if self.episode is not None:
            if newest > self.episode.started_at:
                ended = StallEpisode(**{**self.episode.__dict__, "ended_at": now})
                self.episode = None
                return None, ended
            return None, None
        threshold = self.threshold()
        if now - newest <= threshold:
            return None, None
        self.episodes += 1
        phases = {rank: s.phase_stack for rank, s in sorted(live.items())}
        self.episode = StallEpisode(self.episodes, newest, now, threshold, tuple(sorted(live)),
                                    phases=phases)
        return self.episode, None
