from __future__ import annotations

from stalldoc.agent.statefile import AgentSnapshot, PhaseRecord
from stalldoc.detect.progress import ProgressTracker
from stalldoc.model import HostSample


def agent(marker: int, phase: str = "", phases: tuple = ()) -> AgentSnapshot:
    return AgentSnapshot(1, 0, 0, 1, 0, 0.0, 0.0, marker, 0.0, None, (phase,) if phase else (),
                         "", len(phases), phases, ())


def host(t: float, cpu: float) -> HostSample:
    return HostSample(t, 0, 1, cpu, 0, 1, "sleeping", 0)


def test_stall_after_threshold_and_end_on_progress():
    tracker = ProgressTracker(floor=5)
    tracker.observe(0.0, {0: agent(1)}, {0: host(0, 0)}, 1.0)
    assert tracker.check(5.0) == (None, None)
    started, _ = tracker.check(5.5)
    assert started is not None and started.started_at == 0.0 and started.ranks == (0,)
    tracker.observe(6.0, {0: agent(2)}, {0: host(6, 0)}, 1.0)
    _, ended = tracker.check(6.0)
    assert ended is not None and ended.ended_at == 6.0


def test_threshold_rises_for_a_phase_seen_to_take_long():
    tracker = ProgressTracker(floor=5)
    slow = (PhaseRecord("save", 0.0, 20.0),)
    tracker.observe(20.0, {0: agent(3, "save", slow)}, {}, 1.0)
    assert tracker.threshold() == 40.0
    assert tracker.check(50.0)[0] is None
    assert tracker.check(61.0)[0] is not None


def test_busy_rank_with_changing_stack_progresses():
    tracker = ProgressTracker(floor=6)
    tracker.observe(0.0, {}, {0: host(0.0, 0.0)}, 1.0)
    tracker.observe(3.0, {}, {0: host(3.0, 3.0)}, 1.0)
    assert tracker.due_for_stack(3.0) == [0]
    tracker.stack_seen(0, ("a",), 3.0)
    tracker.stack_seen(0, ("b",), 4.0)
    assert tracker.ranks[0].last_progress == 4.0
    tracker.stack_seen(0, ("b",), 5.0)
    assert tracker.ranks[0].last_progress == 4.0
