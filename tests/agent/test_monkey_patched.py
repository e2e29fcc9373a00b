"""A job that monkey-patches the standard library (gevent's ``monkey.patch_all()``, as reward
servers, crawlers and older RL rollout workers built on gevent do) keeps its own threads and
greenlets to itself: the agent's heartbeat, a real OS thread started before the job's code ran,
never runs gevent's code.

It once did: looked up at call time, ``time.sleep`` in the heartbeat was gevent's after the
patch, so the heartbeat made a gevent hub of its own, importing gevent's modules behind
gevent's import locks while the job's main thread imported them too, and the job deadlocked at
its start about one run in twenty under watch (``benchmarks/gevent_exit.py``), never without.

Real ``stalldoc watch``, real gevent; the job looks at its own threads' frames after the
heartbeat has beaten twice."""
from __future__ import annotations

import sys

import pytest

from stalldoc.agent import runtime
from support import SCENARIOS, watch

pytest.importorskip("gevent")
LOOK = """
from gevent import monkey
monkey.patch_all()
import sys, time
time.sleep({seconds})
for frame in sys._current_frames().values():
    files = []
    while frame is not None:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    if files[0].endswith("agent/runtime.py"):
        print("heartbeat runs gevent's code:", any("/gevent/" in f for f in files), flush=True)
"""


def test_the_heartbeat_never_runs_gevents_code_after_the_job_patched_the_library(tmp_path):
    seconds = 2.5 * runtime.HEARTBEAT_SECONDS
    result = watch(tmp_path, [sys.executable, "-c", LOOK.format(seconds=seconds)])
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines() == ["heartbeat runs gevent's code: False"], (
        result.stdout + result.stderr)


def test_a_gevent_job_ends_with_its_own_code_under_watch(tmp_path):
    # greenlets in socket round trips with a server greenlet, a subprocess, then sys.exit(3)
    result = watch(tmp_path, [sys.executable, str(SCENARIOS / "gevent_rewards.py")],
                   env={"CODE": "3"})
    assert result.code == 3, result.stderr
    assert "16 clients done, sandbox said 45" in result.stdout
