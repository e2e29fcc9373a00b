"""The stack's kind, read from real py-spy dumps of real processes waiting or working."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalldoc.detect.stack_kind import WORKING, StackKind, classify
from stalldoc.model import Frame, RankProcess, RankStacks, ThreadStack
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
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        time.sleep(1.0)
        stacks = StackProbe(None).capture(RankProcess(0, proc.pid, 0, ()), stopped=False,
                                          nonblocking=True)
        return classify(stacks), stacks
    finally:   # the whole session: a pool's forked worker would outlive its parent, computing
        os.killpg(proc.pid, signal.SIGKILL)
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


RAY_LOOP = (Frame("Worker.main_loop", "/v/lib/python3.11/site-packages/ray/_private/worker.py",
                  1069),
            Frame("<module>", "/v/lib/python3.11/site-packages/ray/_private/workers/"
                              "default_worker.py", 323))
AGENT_BEAT = (Frame("Agent._beat", "/run/bootstrap/stalldoc/agent/runtime.py", 108),)


def _ray(*others: ThreadStack) -> RankStacks:
    return RankStacks(0, 4242, 0.0, "py-spy",
                      (ThreadStack(4242, "MainThread", False, False, RAY_LOOP), *others))


def test_a_ray_worker_with_nothing_to_do_is_between_tasks():
    from stalldoc.detect.stack_kind import BETWEEN_TASKS
    stacks = _ray(ThreadStack(4243, "Thread-1", False, False, AGENT_BEAT))
    kind = classify(stacks)
    assert kind.kind == BETWEEN_TASKS and kind.frame.function == "Worker.main_loop"
    assert stacks.main.thread_id == 4242   # the agent's heartbeat is not the job's code


def test_ray_trains_training_thread_is_the_ranks_thread():
    # GIVEN Ray Train's layout: the loop in TrainingThread, stuck in the job's own function
    import threading   # the frames as py-spy gives them on this interpreter
    stuck = (Frame("Condition.wait", threading.__file__, 327),
             Frame("Event.wait", threading.__file__, 629),
             Frame("load_shard", "/home/me/train.py", 36),
             Frame("train_loop_per_worker", "/home/me/train.py", 52),
             Frame("Thread.run", "/usr/lib/python3.11/threading.py", 982))
    stacks = _ray(ThreadStack(4250, "TrainingThread", False, False, stuck),
                  ThreadStack(4243, "Thread-1", False, False, AGENT_BEAT))
    # THEN that thread is the rank's: it waits on a lock in load_shard, not in Ray's loop
    assert stacks.main.name == "TrainingThread"
    kind = classify(stacks)
    assert kind.kind == "waiting: lock" and kind.frame.function == "load_shard"


def test_a_threaded_actor_working_on_a_pool_thread_is_working():
    busy = (Frame("tokenize", "/home/me/reward.py", 20),
            Frame("_worker", "/usr/lib/python3.11/concurrent/futures/thread.py", 83))
    kind = classify(_ray(ThreadStack(4260, "ThreadPoolExecutor-0_0", True, True, busy)))
    assert kind.kind == "working" and kind.frame.function == "tokenize"
