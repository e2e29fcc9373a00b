"""The stall decision with collectives the agent counts from the process groups' sequence
numbers (DDP's reducer, issued from C++): they move a rank's counters like its markers do."""
from __future__ import annotations

from stalldoc.model.agent import AgentSnapshot
from stalldoc.detect.progress import ProgressTracker
from stalldoc.model.samples import HostSample


def agent(issued: int) -> AgentSnapshot:
    """A rank whose markers and rings never move; only its c10d counter does."""
    return AgentSnapshot(1, 0, 0, 1, 0, 0.0, 0.0, 3, 0.0, None, (), "", 0, (), (),
                         c10d_issued=issued, c10d_rose_at=float(issued))


def host(t: float) -> HostSample:   # a rank waiting: no CPU, no I/O, no children
    return HostSample(t, 0, 100, 0.0, 1 << 20, 4, "sleeping", 1 << 30, 0.5, 0, None, 0.0)


def test_collectives_issued_from_cpp_are_progress():
    tracker = ProgressTracker(floor=5)
    for t in range(1, 20):
        tracker.observe(float(t), {0: agent(t)}, {0: host(float(t))})
        assert tracker.check(float(t)) == (None, None)
    assert tracker.work()[0].reason == "progress markers moved"


def test_a_counter_that_stopped_is_no_progress():
    # a rank that issued collectives and then waits inside one that never returns
    tracker = ProgressTracker(floor=5)
    began = []
    for t in range(1, 20):
        tracker.observe(float(t), {0: agent(min(t, 4))}, {0: host(float(t))})
        began.append(tracker.check(float(t))[0])
    [stall] = [b for b in began if b is not None]
    assert stall.started_at == 4.0


def test_the_latest_progress_on_record_takes_every_sign_and_an_exit_zero():
    from stalldoc.model.collectives import CollectiveRecord, GroupState
    from stalldoc.detect.progress import latest_progress
    from stalldoc.model.ranks import RankExit
    ring = (CollectiveRecord("world", 4, "barrier", 1, "float32", 30.0, 31.5, False),
            CollectiveRecord("world", 5, "barrier", 1, "float32", 32.0, None, False))
    agents = {0: AgentSnapshot(1, 0, 0, 2, 1, 0.0, 40.0, 9, 20.0, None, (), "", 2, (),
                               (GroupState("world", 5, 4, ring),), c10d_issued=7,
                               c10d_rose_at=25.0),
              1: AgentSnapshot(2, 1, 1, 2, 1, 0.0, 40.0, 9, 33.0, None, (), "", 2, (), ())}
    exits = [RankExit(1, 2, 38.0, 0, None, "relay"), RankExit(2, 3, 39.0, 1, None, "relay")]
    # rank 0: its last completed collective (the open one is no progress); rank 1: its exit 0;
    # rank 2 exited 1: no progress on record (the heartbeat at 40.0 never counts)
    assert latest_progress(agents, exits) == {0: 31.5, 1: 38.0}
