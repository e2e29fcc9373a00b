"""The stack's kind, read from real py-spy dumps of real processes waiting or working."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalldoc.detect.stack_kind import WORKING, StackKind, classify
from stalldoc.model import RankProcess, RankStacks
from stalldoc.probes.pyspy import StackProbe

PROGRAMS = {
    "sleep_poll": ("import os, time\n"
                   "def wait_for_rollout():\n"
                   "    while not os.path.exists('/nonexistent/flag'):\n"
                   "        time.sleep(0.2)\n"
                   "wait_for_rollout()\n", "waiting: sleep"),
    "queue_get": ("import queue\n"
                  "def next_batch(q):\n"
                  "    return q.get()\n"
                  "next_batch(queue.Queue())\n", "waiting: lock"),
    "lock": ("import threading\n"
             "lock = threading.Lock(); lock.acquire()\n"
             "def update_cache():\n"
             "    lock.acquire()\n"
             "update_cache()\n", "waiting: lock"),
    "pool_map": ("import multiprocessing as mp\n"
                 "def tokenize(n):\n"
                 "    return sum(i * i for i in range(n))\n"
                 "if __name__ == '__main__':\n"
                 "    with mp.get_context('fork').Pool(1) as pool:\n"
                 "        pool.map(tokenize, [10**9])\n", "waiting: "),
    "socket_recv": ("import socket\n"
                    "a, b = socket.socketpair()\n"
                    "def score_with_reward_model():\n"
                    "    return a.recv(4096)\n"
                    "score_with_reward_model()\n", "waiting: socket"),
    "one_line_compute": ("import time\n"
                         "def forward():\n"
                         "    end = time.time() + 60; x = 0\n"
                         "    while time.time() < end: x = (x * 31 + 7) % 1000003\n"
                         "forward()\n", WORKING),
    "c_call": ("import hashlib\n"
               "def derive_key():\n"
               "    return hashlib.pbkdf2_hmac('sha256', b'pw', b'salt', 10**9)\n"
               "derive_key()\n", WORKING),
}


def classified(script: Path) -> tuple[StackKind, RankStacks]:
    """Run ``script``, let it settle 1 s, and classify its real stacks (py-spy, non-blocking)."""
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(1.0)
        stacks = StackProbe(None).capture(RankProcess(0, proc.pid, 0, ()), stopped=False,
                                          nonblocking=True)
        return classify(stacks), stacks
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_real_stacks_are_classified(tmp_path, name):
    code, expected = PROGRAMS[name]
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    kind, stacks = classified(script)
    assert kind.kind.startswith(expected), (kind, stacks)
    if expected == WORKING:
        assert kind.frame is not None and kind.frame.filename == str(script)


THREADED = {
    # the main thread waits on a server; a background thread burns CPU: the rank waits
    "collective_wait_with_busy_thread": (
        "import socket, threading, time\n"
        "def log_metrics():\n"
        "    end = time.time() + 60; x = 0\n"
        "    while time.time() < end: x = (x * 31 + 7) % 1000003\n"
        "threading.Thread(target=log_metrics, daemon=True).start()\n"
        "a, b = socket.socketpair()\n"
        "def all_reduce_stand_in():\n"
        "    return a.recv(4096)\n"
        "all_reduce_stand_in()\n", "waiting: socket", "all_reduce_stand_in"),
    # the main thread joins the thread that works: the rank works, in that thread
    "join_on_worker_thread": (
        "import threading, time\n"
        "def tokenize():\n"
        "    end = time.time() + 60; x = 0\n"
        "    while time.time() < end: x = (x * 31 + 7) % 1000003\n"
        "worker = threading.Thread(target=tokenize)\n"
        "worker.start()\n"
        "worker.join()\n", WORKING, "tokenize"),
    # the main thread polls the worker with sleeps (a common way to wait for a thread): the
    # rank works, in that thread; calling it idle would be a false stall
    "sleep_polling_a_worker_thread": (
        "import threading, time\n"
        "def score_rollouts():\n"
        "    end = time.time() + 60; x = 0\n"
        "    while time.time() < end: x = (x * 31 + 7) % 1000003\n"
        "worker = threading.Thread(target=score_rollouts)\n"
        "worker.start()\n"
        "while worker.is_alive():\n"
        "    time.sleep(0.5)\n", WORKING, "score_rollouts"),
}


@pytest.mark.parametrize("name", sorted(THREADED))
def test_background_threads_count_only_while_the_main_thread_waits_on_them(tmp_path, name):
    # GIVEN a real process with a busy background thread
    code, expected, function = THREADED[name]
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    # WHEN its stacks are classified
    kind, stacks = classified(script)
    # THEN the main thread decides, unless it waits on that thread
    assert kind.kind == expected, (kind, stacks)
    assert kind.frame is not None and kind.frame.function == function
    deciding = next(t for t in stacks.threads if t.thread_id == kind.thread)
    assert (deciding is stacks.main) == (expected != WORKING)
