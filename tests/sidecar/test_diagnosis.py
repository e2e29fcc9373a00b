"""Stalls and their diagnosis: ranks that show no work past the stall timeout are a stall, said
with what they showed; the stall's ranks' stacks are taken (of their real processes) and stay for
the tick rules until the stall ended and its tick is over; with --on-stall kill the job is ended,
and what its ranks do as they are ended is no stall."""
from __future__ import annotations

import dataclasses
import os
import time

from support import RankLauncher, idle_host, watcher_parts
from stalldoc.run.job import JobTree


def _until_stalled(watcher, pids: dict[int, int], t: float) -> float:
    """Tick the tracker and the stall check, each rank idle, until a stall is declared."""
    while watcher.tracker.episode is None:
        t += 1.0
        assert t < 100, "no stall declared"
        watcher.tracker.observe(t, {}, {r: idle_host(t, r, pid) for r, pid in pids.items()})
        watcher.diagnosis.check_stall(t, {})
    return t


def test_a_stall_is_said_diagnosed_ended_and_with_on_stall_kill_ends_the_job(tmp_path):
    launcher = RankLauncher()
    try:
        pids = {rank: launcher.start(rank) for rank in (0, 1)}
        with watcher_parts(tmp_path / "run", gpus=False, agent=False, stall_timeout=3.0,
                           flight_recorder=False) as watcher:
            diagnosis, link = watcher.diagnosis, watcher.link
            watcher.roster.discover(time.time(), JobTree(launcher.pid, os.getpid()))
            # WHEN both ranks show no work past the stall timeout
            t = _until_stalled(watcher, pids, 0.0)
            episode = watcher.tracker.episode
            # THEN the stall is said, with how long no rank worked and how many are diagnosed
            [line] = [s for s in link.said() if s.startswith("STALL")]
            assert line.startswith(f"STALL #{episode.id}: no rank showed work for "
                                   f"{t - episode.started_at:.0f} s")
            assert line.endswith(f"taking stacks of {len(pids)} rank(s)")
            # AND each stalled rank's stacks were taken of its own process
            assert {r: s.pid for r, s in diagnosis.stall_stacks.items()} == pids
            assert not any(m.get("end_job") for m in link.sent)   # only observed
            # WHEN the job reports progress: the stall ends, its stacks stay for this tick
            watcher.tracker.job_progressed(t + 1)
            diagnosis.check_stall(t + 1, {})
            assert f"progress resumed after stall #{episode.id}" in link.said()
            assert diagnosis.stall_stacks
            diagnosis.forget_ended_stall()
            assert diagnosis.stall_stacks == {} and diagnosis.stall_flight == {}
            # WHEN --on-stall kill is set and the ranks stall again
            watcher.opts = dataclasses.replace(watcher.opts, on_stall="kill")
            t = _until_stalled(watcher, pids, t + 1)
            # THEN the job is ended, and its ranks' last moments are no stall of theirs
            assert {"end_job": "stall"} in link.sent and watcher.ctx.ending
            assert link.said()[-1] == "--on-stall kill: ending the job"
            said = len(link.sent)
            watcher.tracker.job_progressed(t + 1)
            diagnosis.check_stall(t + 1, {})
            assert len(link.sent) == said and watcher.tracker.episode is not None
    finally:
        launcher.close()
