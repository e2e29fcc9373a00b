"""The STALL line says what the ranks showed in one line: ranks that showed the same together,
the largest groups first, at most four groups (a 64-rank job once printed the same words 64
times)."""
from __future__ import annotations

from stalldoc.model.work import RankWork
from stalldoc.sidecar.watcher import _grouped


def seen(cpu: float, kind: str = "") -> RankWork:
    return RankWork(1.0, "idle", "", False, cpu, 0, None, 0.0, None, kind)


def test_ranks_that_showed_the_same_are_said_once():
    work = {r: seen(0.0) for r in range(8)} | {3: seen(2.0, "waiting: lock")}
    assert _grouped(work) == ("ranks 0-2,4-7: cpu 0%, io 0 kB/s, stack not sampled; "
                              "rank 3: cpu 2%, io 0 kB/s, stack waiting: lock")


def test_past_four_groups_the_rest_is_counted():
    work = {r: seen(float(r)) for r in range(64)}
    line = _grouped(work)
    assert line.count("rank ") == 4 and line.endswith("; 60 more rank(s) otherwise")
    assert len(line) < 240
