"""A vLLM engine's work is its forward passes once it has run one: its processes' CPU no longer
counts as its rank's work, and new forward passes are its rank's progress."""
from __future__ import annotations

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
