"""How a rank ends, as its agent tells it: an uncaught exception is an exception (the process
exits 1), but an exception a library caught and only *reported* through ``sys.excepthook`` is not.

The case from the field: vLLM's engine shuts down in a ``weakref.finalize`` at interpreter exit;
when the script had already called ``destroy_process_group()``, its cleanup raises "Invalid
process group specified", weakref prints it through ``sys.excepthook``, and the process exits 0.
The agent once took that for an uncaught exception, and the watch reported the healthy rank as
dead with status 1 (SD103, critical).

Real interpreters under the real agent (a plain one, and one whose gloo world made torch wrap
``sys.excepthook`` with its "[rank0]:" prefix); the state file is read after each has exited."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalldoc.agent import statefile
from stalldoc.agent.state_reader import read_state
from stalldoc.run.inject import agent_environment
from support import free_port

WORLD = """
import torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:PORT")
"""
# an engine whose shutdown, run by weakref at exit, fails: the script left its world before
EXIT_FINALIZER = """
import weakref
class Engine:
    pass
def shutdown():
    raise ValueError("Invalid process group specified")
engine = Engine()
weakref.finalize(engine, shutdown)
"""
CAUGHT_AND_REPORTED = """
import sys
try:
    {}["reward_model"]
except KeyError:
    sys.excepthook(*sys.exc_info())
"""
UNCAUGHT = """
def step():
    raise RuntimeError("loss is nan at step 12")
step()
"""
LEAVE_WORLD = "\ndist.destroy_process_group()\n"


def _ended(tmp_path: Path, code: str) -> tuple[subprocess.CompletedProcess, object]:
    run = tmp_path / "run"
    run.mkdir()
    env = agent_environment(run, {**os.environ, "OMP_NUM_THREADS": "1"}, os.getpid())
    script = "import os; print(os.getpid(), flush=True)\n" + code
    out = subprocess.run([sys.executable, "-c", script.replace("PORT", str(free_port()))],
                         env=env, capture_output=True, text=True, timeout=120)
    pid = int(out.stdout.split()[0])
    return out, read_state(str(run / "agents" / f"agent-{pid}.state"))


@pytest.mark.parametrize("code", [EXIT_FINALIZER, WORLD + EXIT_FINALIZER + LEAVE_WORLD,
                                  CAUGHT_AND_REPORTED],
                         ids=["finalizer", "finalizer-after-world", "caught-then-reported"])
def test_an_exception_only_reported_is_not_how_the_process_ends(tmp_path: Path, code: str):
    out, state = _ended(tmp_path, code)
    # the job printed the traceback and exited 0
    assert out.returncode == 0 and "Traceback" in out.stderr, out.stderr
    assert state.status == statefile.STATUS_EXITED and state.error == "", (state.status,
                                                                           state.error)


@pytest.mark.parametrize("code", [UNCAUGHT, WORLD + UNCAUGHT, EXIT_FINALIZER + UNCAUGHT],
                         ids=["plain", "in-a-world", "with-a-finalizer-too"])
def test_an_uncaught_exception_is_how_the_process_ends(tmp_path: Path, code: str) -> None:
    out, state = _ended(tmp_path, code)
    assert out.returncode == 1, out.stderr
    assert state.status == statefile.STATUS_EXCEPTION, state.status
    assert "RuntimeError: loss is nan at step 12" in state.error
