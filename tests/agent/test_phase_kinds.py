"""The agent counts each kind of phase's time as it enters and leaves phases: exclusive (a weight
sync inside a rollout inside a step is the sync's alone), and how often each kind began (a kind
inside itself counts once). The clock is the only thing replaced: every time is then exact."""
from __future__ import annotations

import types

import pytest

from stalldoc.agent import runtime
from stalldoc.agent.state_reader import read_state


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def agent(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(runtime, "time", types.SimpleNamespace(time=clock.time,
                                                               perf_counter=clock.perf_counter))
    made = runtime.Agent(str(tmp_path))
    made.clock = clock
    yield made
    made.state.close()


def test_nested_kinds_are_exclusive(agent):
    agent.clock.now += 1.0
    agent.phase_enter("step")
    agent.clock.now += 0.5                      # step's own
    agent.phase_enter("rollout")
    agent.clock.now += 0.25                     # rollout's own
    agent.phase_enter("weight_sync")
    agent.clock.now += 3.0
    agent.phase_enter("weight_sync")            # an inner sync call: the same sync
    agent.clock.now += 1.0
    agent.phase_exit("weight_sync")
    agent.phase_exit("weight_sync")
    agent.phase_enter("generate")
    agent.clock.now += 2.0
    agent.phase_exit("generate")
    agent.phase_exit("rollout")
    agent.phase_enter("forward")                # no kind: the step's time
    agent.clock.now += 4.0
    agent.phase_exit("forward")
    agent.phase_enter("offload_model")          # swift's offload: kind offload
    agent.clock.now += 0.75
    agent.phase_exit("offload_model")
    agent.phase_exit("step")
    agent.clock.now += 10.0                     # outside any phase: counted nowhere
    kinds = read_state(agent.state.path).kinds
    assert dict(kinds.seconds) == {"step": 4.5, "rollout": 0.25, "generate": 2.0,
                                   "reward": 0.0, "weight_sync": 4.0, "offload": 0.75,
                                   "async_wait": 0.0}
    assert dict(kinds.entries) == {"step": 1, "rollout": 1, "generate": 1, "reward": 0,
                                   "weight_sync": 1, "offload": 1, "async_wait": 0}
    assert kinds.counted_at == 1000.0 + 1.0 + 0.5 + 0.25 + 4.0 + 2.0 + 4.0 + 0.75


def test_a_phase_left_by_an_outer_exit_stops_counting(agent):
    # GIVEN a sync left without its own exit (an exception unwound past a hook that did not
    # see it): the step's exit closes both
    agent.phase_enter("step")
    agent.phase_enter("weight_sync")
    agent.clock.now += 2.0
    agent.phase_exit("step")
    agent.clock.now += 5.0
    agent.phase_enter("reward")
    agent.clock.now += 1.0
    agent.phase_exit("reward")
    kinds = read_state(agent.state.path).kinds
    assert (kinds.spent("weight_sync"), kinds.spent("step"), kinds.spent("reward")) == \
        (2.0, 0.0, 1.0)


def test_a_process_with_no_phase_of_a_kind_has_no_counts(agent):
    agent.phase_enter("checkpoint_save")
    agent.clock.now += 1.0
    agent.phase_exit("checkpoint_save")
    assert read_state(agent.state.path).kinds is None
