from __future__ import annotations

from stalldoc.detect.progress import ProgressTracker
from stalldoc.model import HostSample
from stalldoc.watch import PROGRESS_LINE


def sample(rank: int, t: float) -> HostSample:
    return HostSample(t, rank, 100 + rank, 1.0, 0, 1, "sleeping", 0)


def test_a_logged_step_is_progress_for_every_live_rank():
    tracker = ProgressTracker(floor=5.0)
    tracker.observe(0.0, {}, {0: sample(0, 0.0), 1: sample(1, 0.0)}, 1.0)
    tracker.mark_dead(1)
    tracker.job_progressed(4.0)
    assert tracker.last_progress() == {0: 4.0, 1: 0.0}
    started, _ = tracker.check(8.0)
    assert started is None        # 4 s since the logged step, under the 5 s floor


def test_swift_progress_lines():
    lines = ["Train: 3/6 {'loss': 0.1, 'global_step/max_steps': '3/6', 'elapsed_time': '2s'}",
             "It took 2.41 seconds to fall asleep.", "It took 0.93 seconds to wake up tags ['kv']",
             "Memory cleanup attempt 1"]
    assert all(PROGRESS_LINE.search(line) for line in lines)
    assert not PROGRESS_LINE.search("max_steps: 6")
