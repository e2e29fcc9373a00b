"""A vLLM engine's work, told by its forward passes: each worker's agent counts one per
``execute_model`` (``agent/hooks.py``). Once an engine has run one, its processes' CPU says
nothing alone (a worker spins in its TP all-reduce while another worker hangs, the engine core
polls its workers' queue): their CPU and I/O are no longer counted as their rank's work, and a
rank whose engine ran a forward pass since the last tick made progress. Before its first one,
the engine is starting (loading weights, profiling, compiling) and its CPU is its rank's work.
A process an engine process started that is none of the engine's (the C++ compiler of
``torch.compile`` at a TP worker's first steps) stays its rank's work (``probes/host.py``).

An engine whose every engine core has waited for requests for ``IDLE_AFTER`` seconds (blocked
in its input queue: its agent's ``engine_idle`` phase) has no request in hand: a core stuck in a
step never is in that phase, so a hung engine is never taken for an idle one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from stalldoc.agent.statefile import ENGINE_IDLE
from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.ranks import EngineProcess

IDLE_AFTER = 1.0   # seconds in the wait: not a core passing through it between two steps


@dataclass(frozen=True)
class EngineTick:
    """One tick of the engines: the ranks whose engines ran forward passes since the last
    tick, and the engine processes of engines that serve (have run one)."""

    progressed: frozenset[int] = frozenset()
    serving: frozenset[int] = frozenset()
    idle: frozenset[int] = frozenset()   # ranks whose engine waits for requests
    ran: frozenset[int] = frozenset()    # ranks whose engine has run a forward pass


@dataclass
class EngineProgress:
    last: dict[int, int] = field(default_factory=dict)   # worker pid -> forward passes

    def tick(self, engines: Iterable[EngineProcess], markers: Mapping[int, int],
             cores: Mapping[int, AgentSnapshot] | None = None, now: float = 0.0) -> EngineTick:
        """``markers``: each worker's forward passes so far (its agent's marker count);
        ``cores``: the engine cores' agent states (pid ->), read at ``now``."""
        engines = list(engines)
        progressed, serving_owners, counts = set(), set(), {}
        for engine in engines:
            count = markers.get(engine.pid)
            if engine.role != "worker" or count is None:
                continue
            counts[engine.pid] = count
            if count > 0:
                serving_owners.add(engine.owner)
            if engine.owner is not None and count != self.last.get(engine.pid, count):
                progressed.add(engine.owner)
        self.last = counts
        serving = {e.pid for e in engines if e.owner in serving_owners}
        idle = idle_owners(engines, cores or {}, now) - progressed
        return EngineTick(frozenset(progressed), frozenset(serving), frozenset(idle),
                          frozenset(serving_owners - {None}))


def idle_owners(engines: Iterable[EngineProcess], cores: Mapping[int, AgentSnapshot],
                now: float) -> set[int]:
    """Ranks each of whose engine cores has waited for requests for ``IDLE_AFTER`` s; a core
    whose agent cannot be read makes its rank's engine not idle."""
    waiting: dict[int, bool] = {}
    for engine in engines:
        if engine.role != "engine core" or engine.owner is None:
            continue
        state = cores.get(engine.pid)
        idle = (state is not None and state.phase == ENGINE_IDLE
                and now - state.last_marker_at >= IDLE_AFTER)
        waiting[engine.owner] = waiting.get(engine.owner, True) and idle
    return {owner for owner, idle in waiting.items() if idle}
