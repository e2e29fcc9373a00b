"""The torch gate (``agent/torch_gate.py``): a daemon thread's calls into torch's C++ never run
while the interpreter finalizes, where they abort the process (SIGABRT, 'terminate called
without an active exception'). Real torch, real gloo, the real agent, real interpreter exits."""
from __future__ import annotations

import _thread
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stalldoc.run.inject import agent_environment

from stalldoc.agent.torch_gate import CLOSE_WAIT, TorchGate

# A DDP job of one gloo rank under the real agent, whose heartbeat beats without pause and spends
# most of each beat inside torch's C++ (each sequence-number read done 20,000 times, the GIL
# released in each): the exit race, rare at 0.25 s beats, becomes certain. "bare" takes the gate
# out of the heartbeat's path, as the agent was before it.
JOB = """
import os, sys, tempfile, time
import torch, torch.distributed as dist
from torch import nn
from stalldoc.agent import c10d_counters, runtime
runtime.HEARTBEAT_SECONDS = 0.0
one = c10d_counters._sequence
c10d_counters._sequence = lambda group: [one(group) for _ in range(20000)][-1]
if sys.argv[1] == "bare":
    runtime.Agent._through_gate = lambda self, fn, *args: fn(*args)
store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
for _ in range(3):
    model(torch.ones(2, 4)).sum().backward()
time.sleep(0.2)
print("trained", flush=True)
"""


def _exits(tmp_path: Path, mode: str, runs: int, until_abort: bool = False
           ) -> list[tuple[int, str]]:
    results: list[tuple[int, str]] = []
    for run in range(runs):
        if until_abort and any(code == -6 for code, _ in results):
            break
        run_dir = tmp_path / f"{mode}{run}"
        run_dir.mkdir(mode=0o700)
        env = agent_environment(run_dir, dict(os.environ), os.getpid())
        out = subprocess.run([sys.executable, "-c", JOB, mode], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.stdout.strip() == "trained", out.stderr[-500:]
        results.append((out.returncode, out.stderr))
    return results


def test_without_the_gate_the_heartbeat_in_torch_aborts_a_finished_job(tmp_path):
    # the hazard itself, on this torch: the job printed its last line and still died (a race:
    # one run in a few escapes it, so up to 8 runs, ending at the first abort)
    results = _exits(tmp_path, "bare", 8, until_abort=True)
    assert any(code == -6 and "terminate called without an active exception" in err
               for code, err in results), results


def test_behind_the_gate_every_exit_is_clean(tmp_path):
    results = _exits(tmp_path, "gated", 6)
    assert [code for code, _ in results] == [0] * 6, [err[-300:] for _, err in results]


def test_close_waits_for_the_call_in_progress_then_refuses_the_rest():
    gate, entered, release, order = TorchGate(), threading.Event(), threading.Event(), []

    def slow() -> str:
        entered.set()
        release.wait(5)
        order.append("call returned")
        return "read"

    worker = threading.Thread(target=gate.call, args=(slow,))
    worker.start()
    entered.wait(5)
    closer = threading.Thread(target=lambda: (gate.close(), order.append("closed")))
    closer.start()
    time.sleep(0.1)
    assert order == [] and not gate.closed   # the exit waits for the call inside torch
    release.set()
    worker.join(5)
    closer.join(5)
    assert order == ["call returned", "closed"]
    assert gate.call(lambda: "read") is None   # and nothing enters after


def test_a_call_that_never_returns_holds_the_exit_only_a_bounded_time():
    gate, entered = TorchGate(), threading.Event()
    _thread.start_new_thread(gate.call, (lambda: (entered.set(), time.sleep(30)),))
    entered.wait(5)
    began = time.monotonic()
    gate.close()
    assert gate.closed and CLOSE_WAIT <= time.monotonic() - began < CLOSE_WAIT + 2


def test_errors_pass_through_to_the_caller_and_the_gate_stays_open():
    gate = TorchGate()
    with pytest.raises(ZeroDivisionError):
        gate.call(lambda: 1 / 0)
    assert gate.call(lambda x: x + 1, 1) == 2


def test_a_forked_child_never_waits_on_a_lock_copied_held():
    gate, entered = TorchGate(), threading.Event()
    _thread.start_new_thread(gate.call, (lambda: (entered.set(), time.sleep(30)),))
    entered.wait(5)
    gate.forget_after_fork()   # what the child does: its heartbeat does not exist
    began = time.monotonic()
    gate.close()
    assert gate.closed and time.monotonic() - began < CLOSE_WAIT / 2
