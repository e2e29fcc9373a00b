"""A vLLM engine's work, told by its forward passes: each worker's agent counts one per
``execute_model`` (``agent/hooks.py``). Once an engine has run one, its processes' CPU says
nothing alone (a worker spins in its TP all-reduce while another worker hangs, the engine core
polls its workers' queue): their CPU and I/O are no longer counted as their rank's work, and a
rank whose engine ran a forward pass since the last tick made progress. Before its first one,
the engine is starting (loading weights, profiling, compiling) and its CPU is its rank's work."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from stalldoc.model.ranks import EngineProcess


@dataclass(frozen=True)
class EngineTick:
    """One tick of the engines: the ranks whose engines ran forward passes since the last
    tick, and the engine processes of engines that serve (have run one)."""

    progressed: frozenset[int] = frozenset()
    serving: frozenset[int] = frozenset()


@dataclass
class EngineProgress:
    last: dict[int, int] = field(default_factory=dict)   # worker pid -> forward passes

    def tick(self, engines: Iterable[EngineProcess], markers: Mapping[int, int]) -> EngineTick:
        """``markers``: each worker's forward passes so far (its agent's marker count)."""
        engines = list(engines)
        progressed, serving_owners, now = set(), set(), {}
        for engine in engines:
            count = markers.get(engine.pid)
            if engine.role != "worker" or count is None:
                continue
            now[engine.pid] = count
            if count > 0:
                serving_owners.add(engine.owner)
            if engine.owner is not None and count != self.last.get(engine.pid, count):
                progressed.add(engine.owner)
        self.last = now
        serving = {e.pid for e in engines if e.owner in serving_owners}
        return EngineTick(frozenset(progressed), frozenset(serving))
