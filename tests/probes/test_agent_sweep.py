"""Sweeping the agents directory: files of ended non-rank processes go, live ones stay."""
from __future__ import annotations

import os
import subprocess
import time

from stalldoc.agent.statefile import StateWriter, state_path
from stalldoc.probes.agent_state import AgentStateProbe, StartupCosts


def _state(directory: str, pid: int, startup: float) -> None:
    writer = StateWriter(state_path(directory, pid), pid, -1, -1, -1, time.time())
    writer.identity(0, 0, 0, startup, b"python")
    writer.close()


def test_ended_processes_are_swept_live_and_starting_ones_kept(tmp_path):
    directory = str(tmp_path)
    ended = _finished_pid()
    _state(directory, ended, 0.004)                       # a reward subprocess that ended
    _state(directory, os.getpid(), 0.003)                 # a live one (this test)
    starting = subprocess.Popen(["sleep", "30"])
    open(state_path(directory, starting.pid), "wb").close()   # its agent is creating the file
    rank = _finished_pid()
    _state(directory, rank, 0.005)                        # a rank that ended: kept for the report
    costs = StartupCosts()
    try:
        removed = AgentStateProbe(directory).sweep({rank}, costs)
        left = AgentStateProbe(directory).pids_with_state()
    finally:
        starting.kill()
        starting.wait()
    assert removed == 1
    assert left == {os.getpid(), starting.pid, rank}
    assert costs.seconds == [0.004]


def _finished_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
