"""Who is who in the job: the roster finds the ranks a real launcher started (RANK in their
environment), hands their pids on for the relay, says each once, sees a rank whose process
ended, and takes a new process under a known number for the ranks' next attempt."""
from __future__ import annotations

import os
import time

from support import RankLauncher, watcher_parts
from stalldoc.run.job import JobTree
from stalldoc.sidecar.roster import Discovered


def test_the_ranks_a_launcher_started_and_started_again(tmp_path):
    launcher = RankLauncher()
    try:
        pids = {rank: launcher.start(rank) for rank in (0, 1)}
        with watcher_parts(tmp_path / "run", gpus=False, agent=False) as watcher:
            roster, job = watcher.roster, JobTree(launcher.pid, os.getpid())
            # WHEN the roster looks at the job
            found = roster.discover(time.time(), job)
            # THEN each rank is said once with its process, and its pid goes to the relay
            assert sorted(found.lines) == [f"rank {r}: pid {p}" for r, p in sorted(pids.items())]
            assert sorted(found.launched) == sorted(pids.values())
            assert {rank: r.pid for rank, r in roster.ranks.items()} == pids
            assert roster.discover(time.time(), job) == Discovered()   # nothing new
            # WHEN rank 1's process exits and its launcher reaps it
            launcher.fail(1)
            assert roster.discover(time.time(), job) == Discovered()
            # THEN it is ending (gone from the table, its exit not recorded yet), rank 0 lives
            assert roster.ending() == {1}
            # WHEN the launcher starts rank 1 again
            pids[1] = launcher.start(1)
            found = roster.discover(time.time(), job)
            # THEN the ranks run a second attempt, which the findings from now on say
            assert found.lines == ("attempt 2: the ranks run again, in new processes",
                                   f"rank 1: pid {pids[1]}")
            assert found.launched == (pids[1],)
            assert watcher.ledger.attempt == 2
            assert roster.attempts.of_process(pids[1]) == 2
            assert roster.attempts.of_process(pids[0]) == 1
            assert [r.pid for r in roster.live()] == [pids[0], pids[1]]
            assert roster.ending() == set()
    finally:
        launcher.close()
