"""The ranks' exits judged: a rank's exit gets the status its launcher reaped (the relay passes
it on), else the launcher's word in the job's log; the exit rules' finding names the rank and is
printed as a diagnosis; once the launcher runs the rank again, the exit was recovered from."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from support import RankLauncher, watcher_parts
from stalldoc.model.ranks import RankExit
from stalldoc.model.samples import LogLine
from stalldoc.run.job import JobTree


def test_a_failed_rank_is_judged_and_resolved_once_its_launcher_runs_it_again(tmp_path):
    launcher = RankLauncher()
    try:
        pids = {rank: launcher.start(rank) for rank in (0, 1)}
        with watcher_parts(tmp_path / "run", gpus=False, agent=False) as watcher:
            job, judge = JobTree(launcher.pid, os.getpid()), watcher.exit_judge
            watcher.roster.discover(time.time(), job)
            # WHEN rank 1 exits 3 and the relay passes on the status its launcher reaped
            watcher.link.reaped[pids[1]] = launcher.fail(1)
            deadline = time.time() + 30
            while not watcher.exits.by_rank and time.time() < deadline:
                judge.collect(time.time(), final=False)   # until the death has settled
                time.sleep(0.2)
            # THEN its exit is recorded with that status
            [ended] = watcher.exits.by_rank.values()
            assert (ended.rank, ended.pid, ended.exit_code, ended.source) == (1, pids[1], 3,
                                                                               "relay")
            # AND the exit rules' finding names rank 1 and was printed as a diagnosis
            [entry] = watcher.ledger.open_entries("exit")
            assert entry.finding.ranks == (1,) and entry.finding.evidence.get("pid") == pids[1]
            assert any(line.startswith("diagnosis:") and entry.finding.code in line
                       for line in watcher.link.said())
            # WHEN the launcher starts rank 1 again (found once its new process runs with
            # its RANK: a loaded node may take a moment from its fork to its exec)
            pids[1] = launcher.start(1)
            deadline = time.time() + 30
            while time.time() < deadline:
                watcher.roster.discover(time.time(), job)
                if getattr(watcher.roster.ranks.get(1), "pid", None) == pids[1]:
                    break
                time.sleep(0.1)
            judge.recover_restarts(time.time())
            # THEN the exit finding is resolved: the job recovered from it
            assert watcher.ledger.open_entries("exit") == ()
            assert f"resolved: {entry.finding.code}" in "\n".join(watcher.link.said())
    finally:
        launcher.close()


def _unknown(rank: int, pid: int) -> RankExit:
    return RankExit(rank, pid, 1.0, None, None, "unknown")


def _waited(code: str) -> tuple[int, int]:
    """A process that runs ``code``: its pid, and its raw wait status."""
    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.pid, status


def test_a_status_nobody_saw_is_taken_from_the_relay_or_the_launchers_log(tmp_path):
    with watcher_parts(tmp_path / "run", gpus=False, agent=False) as watcher:
        judge = watcher.exit_judge
        # a status the relay reaped: an exit code, a signal
        exited, status = _waited("raise SystemExit(7)")
        watcher.link.reaped[exited] = status
        known = judge.with_known_status(_unknown(0, exited))
        assert (known.exit_code, known.signal, known.source) == (7, None, "relay")
        killed, status = _waited("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        watcher.link.reaped[killed] = status
        known = judge.with_known_status(_unknown(1, killed))
        assert known.signal == signal.SIGKILL and known.source == "relay"
        # torchrun's report of a rank it reaped, in the job's log
        watcher.logs.put(LogLine(2.0, "stderr", f"  exitcode  : -9 (pid: {os.getpid()})"))
        watcher.logs.drain()
        known = judge.with_known_status(_unknown(2, os.getpid()))
        assert known.signal == signal.SIGKILL and known.source == "launcher-log"
        # a status already known, or one nobody knows, is left as it is
        seen = RankExit(3, exited, 1.0, 0, None, "waitpid")
        assert judge.with_known_status(seen) == seen
        assert judge.with_known_status(_unknown(3, 1)) == _unknown(3, 1)
