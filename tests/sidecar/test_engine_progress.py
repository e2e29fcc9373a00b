"""A vLLM engine's work is its forward passes once it has run one: its processes' CPU no longer
counts as its rank's work, and new forward passes are its rank's progress. An engine whose core
has waited for requests for a second (its agent's ``engine_idle`` phase) is idle."""
from __future__ import annotations

from stalldoc.agent.statefile import ENGINE_IDLE
from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.ranks import EngineProcess
from stalldoc.sidecar.engine_progress import EngineProgress

CORE, TP0, TP1 = (EngineProcess(10, "engine core", 0), EngineProcess(11, "worker", 0, 0, 2),
                  EngineProcess(12, "worker", 0, 1, 2))
OTHER = EngineProcess(21, "worker", 1, 0, 1)   # rank 1's engine


def test_a_starting_engine_is_its_ranks_cpu_then_its_forward_passes_are_its_progress():
    progress = EngineProgress()
    engines = (CORE, TP0, TP1, OTHER)
    # loading: no forward pass yet anywhere, so nothing is set apart and nothing progressed
    first = progress.tick(engines, {11: 0, 12: 0, 21: 0})
    assert (first.progressed, first.serving) == (frozenset(), frozenset())
    # rank 0's engine ran its first forward passes: its three processes are set apart
    second = progress.tick(engines, {11: 3, 12: 3, 21: 0})
    assert second.progressed == {0} and second.serving == {10, 11, 12}
    # one worker hangs, the other spins: no new forward pass, no progress, still apart
    third = progress.tick(engines, {11: 3, 12: 3, 21: 0})
    assert third.progressed == frozenset() and third.serving == {10, 11, 12}


def test_a_worker_without_an_agent_file_says_nothing():
    progress = EngineProgress()
    tick = progress.tick((CORE, TP0), {})
    assert (tick.progressed, tick.serving) == (frozenset(), frozenset())


def _core_state(phase: str, entered_at: float) -> AgentSnapshot:
    """An engine core's agent state: its innermost phase and when its last marker was (entering
    that phase)."""
    return AgentSnapshot(10, 0, 0, 1, 0, 0.0, entered_at, 7, entered_at, None,
                         (phase,) if phase else (), "", 0, (), ())


def test_an_engine_whose_core_waits_for_requests_is_idle_once_it_waited_a_second():
    progress = EngineProgress()
    # GIVEN rank 0's engine core blocked in its wait for requests since t=100
    waiting = {10: _core_state(ENGINE_IDLE, 100.0)}
    # THEN at t=100.5 it may only be passing through the wait between two steps: not idle
    assert progress.tick((CORE, TP0, TP1), {11: 3, 12: 3}, waiting, 100.5).idle == frozenset()
    # AND at t=102 its rank's engine waits for requests
    assert progress.tick((CORE, TP0, TP1), {11: 3, 12: 3}, waiting, 102.0).idle == {0}


def test_an_engine_in_a_step_or_unread_or_stepping_is_not_idle():
    progress = EngineProgress()
    progress.tick((CORE, TP0), {11: 3}, {}, 0.0)
    # a core in a step (outside the wait), a core whose agent cannot be read, and a core seen
    # in the wait while its workers ran a forward pass since the last tick
    assert progress.tick((CORE, TP0), {11: 3}, {10: _core_state("", 10.0)}, 20.0).idle == set()
    assert progress.tick((CORE, TP0), {11: 3}, {}, 20.0).idle == set()
    assert progress.tick((CORE, TP0), {11: 4}, {10: _core_state(ENGINE_IDLE, 1.0)},
                         21.0).idle == set()
