"""The agent names the thread that entered the innermost phase (its native id, as py-spy and
/proc name threads), for the watcher to let that thread's work count as the rank's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from stalldoc.run.inject import agent_environment

CODE = """
import json, os, threading
import stalldoc
from stalldoc.agent import runtime
from stalldoc.agent.state_reader import read_state

def seen():
    agent = runtime.current()
    return read_state(agent.state.path).phase_thread
main = threading.get_native_id()
log = {"before": seen()}
with stalldoc.phase("train_step"):
    log["main phase"] = seen()
    def rollout():
        with stalldoc.phase("rollout"):
            log["thread"] = threading.get_native_id()
            log["thread phase"] = seen()
        log["thread left"] = seen()
    worker = threading.Thread(target=rollout)
    worker.start(); worker.join()
    with stalldoc.phase("forward"):
        log["nested on main"] = seen()
log["after"] = seen()
log["main"] = main
print(json.dumps(log))
print(os.getpid())
"""


def test_the_innermost_phases_thread_is_published_and_restored_on_exit(tmp_path):
    # GIVEN a rank entering a phase on its main thread, a phase on a generation thread inside
    # it, and a nested phase on the main thread again
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    log = json.loads(out.stdout.splitlines()[0])
    # THEN the state file names the thread of the innermost phase, and the outer one's again
    # once the inner phase ends; no phase: no thread
    assert log["before"] == 0 and log["after"] == 0
    assert log["main phase"] == log["main"] == log["nested on main"]
    assert log["thread phase"] == log["thread"] != log["main"]
    assert log["thread left"] == log["main"]
