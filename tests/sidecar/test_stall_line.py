"""The STALL line says what the ranks showed in one line: ranks that do the same (their stack's
kind) together, a figure that differs between them the most any showed, the largest groups first,
at most four groups (a 64-rank job once printed the same words 64 times; a 3-rank demo, whose
idle ranks showed 0 %, 2 % and 0 % with a 1 % wait for a CPU, printed three groups)."""
from __future__ import annotations

from stalldoc.model.work import RankWork
from stalldoc.sidecar.diagnosis import _grouped


def seen(cpu: float, kind: str = "", wait: float | None = None, io: float = 0.0) -> RankWork:
    return RankWork(1.0, "idle", "", False, cpu, 0, None, io, None, kind, cpu_wait_percent=wait)


def test_ranks_that_do_the_same_are_said_once():
    work = {r: seen(0.0) for r in range(8)} | {3: seen(2.0, "waiting: lock")}
    assert _grouped(work) == ("ranks 0-2,4-7: cpu 0%, io 0 kB/s, stack not sampled; "
                              "rank 3: cpu 2%, io 0 kB/s, stack waiting: lock")


def test_figures_that_differ_are_the_most_any_rank_showed():
    # the demo's three idle ranks, one that waited for a CPU, one that read a little
    work = {0: seen(2.0), 1: seen(0.0, wait=1.2), 2: seen(0.0, io=3e5)}
    assert _grouped(work) == ("ranks 0-2: cpu up to 2% (waiting for a CPU up to 1%), "
                              "io up to 0.3 MB/s, stack not sampled")


def test_past_four_kinds_the_rest_is_counted():
    work = {r: seen(float(r), f"waiting: lock {r}") for r in range(64)}
    line = _grouped(work)
    assert line.count("rank ") == 4 and line.endswith("; 60 more rank(s) otherwise")
    assert len(line) < 240
    # 64 ranks that showed different figures while doing the same are one group
    assert _grouped({r: seen(float(r)) for r in range(64)}) == (
        "ranks 0-63: cpu up to 63%, io 0 kB/s, stack not sampled")
