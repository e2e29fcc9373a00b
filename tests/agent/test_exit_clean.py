"""A job that finished exits, in its own time and with its own code, under watch: the agent
never makes the interpreter wait for it at exit, nor changes what ``threading`` takes for the
main thread (issue 26: ``threading`` first imported inside the heartbeat thread made a plain
Python process that never imported it hang at exit forever, waiting for the heartbeat).

Real ``stalldoc watch``, real interpreters that never import ``threading`` before their end,
as the command and as children of a real torchrun job; lengths from 1 s to past the agent's
longest timer (the versions publisher's wait for torch)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stalldoc.agent import runtime, versions
from stalldoc.run.inject import agent_environment
from support import torchrun, watch

LONGEST_TIMER = versions.WAIT_BEATS * runtime.HEARTBEAT_SECONDS   # seconds
PAST_EVERY_TIMER = LONGEST_TIMER + 2
# never imports threading before its very end; then checks the main thread is its own
PLAIN = """
import sys, time
time.sleep({seconds})
import _thread, threading
print("main thread is mine:", threading.main_thread().ident == _thread.get_ident(),
      threading.current_thread() is threading.main_thread(), flush=True)
sys.exit({code})
"""


@pytest.mark.parametrize("seconds,code", [(1, 0), (3, 3), (PAST_EVERY_TIMER, 7)])
def test_a_plain_python_command_exits_with_its_own_code(tmp_path, seconds, code):
    result = watch(tmp_path, [sys.executable, "-c", PLAIN.format(seconds=seconds, code=code)],
                   timeout=seconds + 60)
    assert result.code == code, result.stderr
    assert "main thread is mine: True True" in result.stdout, result.stdout + result.stderr


def test_without_watch_the_same_command_is_the_baseline():
    # the job alone behaves as the test above expects of it under watch
    out = subprocess.run([sys.executable, "-c", PLAIN.format(seconds=0, code=3)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "main thread is mine: True True" in out.stdout


def test_plain_python_children_of_a_torchrun_job_exit_in_their_own_time(tmp_path):
    # rank 0's child runs 1 s, rank 1's past every timer of the agent; both exit 5 as told
    result = watch(tmp_path, torchrun(2, "plain_children.py"), "--stall-timeout", "60",
                   env={"CHILD_SECONDS": f"1,{PAST_EVERY_TIMER}", "CHILD_CODE": "5"},
                   timeout=PAST_EVERY_TIMER + 120)
    assert result.code == 0, result.stderr
    for rank, seconds in ((0, 1), (1, PAST_EVERY_TIMER)):
        assert (f"rank {rank}: child of {seconds} s exited 5: main thread is mine: True True"
                in result.stdout), result.stdout + result.stderr


def test_the_agent_imports_threading_from_the_main_thread(tmp_path):
    # by the job's first line, threading is imported and knows the real main thread
    code = ("import sys, _thread\nm = sys.modules.get('threading')\n"
            "print(m is not None and m.main_thread().ident == _thread.get_ident())")
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
    assert list((tmp_path / "agents").glob("agent-*.state")), "the agent did not start"
