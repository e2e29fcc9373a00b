"""Flight Recorder dumps from the agent of a real gloo process (world size 1), on the watcher's
request, read back by the watcher's side without torch."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalldoc.run.inject import agent_environment
from stalldoc.probes.flight_dumps import FlightDumps

JOB = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    if os.environ["INIT"]:
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
    if os.environ["INIT"] == "funcol":   # functional collectives import torch._inductor
        sub = dist.new_group([0])
        funcol.all_reduce(torch.ones(3), "sum", sub)     # not wrapped by the agent
    if os.environ["INIT"]:
        dist.all_reduce(torch.ones(5))
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    print("torch._inductor" in sys.modules, flush=True)
""")


def start(run_dir: Path, init: str, **extra: str) -> tuple[subprocess.Popen[str], int]:
    from support import free_port
    env = {**agent_environment(run_dir, dict(os.environ), os.getpid()), "INIT": init,
           **extra}
    proc = subprocess.Popen([sys.executable, "-c", JOB % free_port()], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    ready = run_dir / "agents" / f"flight-{pid}"
    deadline = time.time() + 20
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the agent never said it can dump"
    return proc, pid


def stop(proc: subprocess.Popen[str]) -> str:
    """End the job; what it printed last (whether torch._inductor got imported)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    out = proc.stdout.read()
    proc.wait(timeout=30)
    return out.strip()


def dump_once(tmp_path, job: str, wait: float, **env: str) -> tuple[dict, str]:
    """Start ``job``, ask its agent for one dump, stop it: the dumps read, and whether the job
    had imported torch._inductor."""
    proc, pid = start(tmp_path, job, **env)
    try:
        probe = FlightDumps(tmp_path / "agents", tmp_path / "flight", wait=wait)
        probe.request({0: pid})
        dumps = probe.collect()
    finally:
        inductor = stop(proc)
    return dumps, inductor


def test_dump_on_request_lands_in_torchs_layout_and_torchfrtrace_reads_it(tmp_path):
    dumps, inductor = dump_once(tmp_path, "funcol", 10)
    # THEN rank 0's dump came, private, with the functional collective of the new group
    path = tmp_path / "flight" / "rank_0"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path / "flight")) == ["rank_0"]
    ops = {(e.group, e.seq, e.op) for e in dumps[0].entries}
    assert ("1", 1, "gloo:all_reduce") in ops and ("0", 1, "gloo:all_reduce") in ops
    # AND the group table names the groups (torch 2.13's gloo lists them under '')
    assert dumps[0].groups == {"0": (0,), "1": (0,)}
    # AND with Python frames: torch._inductor, which symbolizes them, was imported already
    assert inductor == "True"
    assert all(any(f.filename == "<string>" for f in e.frames) for e in dumps[0].entries)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                          str(tmp_path / "flight")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "agent-errors.log").exists()


def test_no_process_group_no_dump_and_no_error(tmp_path):
    proc, pid = start(tmp_path, "")
    try:
        probe = FlightDumps(tmp_path / "agents", tmp_path / "flight", wait=1)
        probe.request({0: pid})
        assert probe.collect() == {}
    finally:
        stop(proc)
    assert not (tmp_path / "agent-errors.log").exists()


@pytest.mark.parametrize("asked,frames", [(None, False), ("1", True)])
def test_frames_only_where_cheap_or_asked_for(tmp_path, asked, frames):
    # GIVEN a job that never imported torch._inductor (taking frames would import it)
    extra = {"STALLDOC_FLIGHT_STACKS": asked} if asked else {}
    dumps, inductor = dump_once(tmp_path, "plain", 15, **extra)
    [entry] = [e for e in dumps[0].entries if e.group == "0"]
    assert any(f.filename == "<string>" for f in entry.frames) == frames
    assert inductor == str(frames)


def test_nccl_jobs_dump_nccls_own_recorder():
    # NCCL cannot run here: its binding is stood in for, at the lowest level (torch's c10d module)
    from stalldoc.agent.flight import _raw_dump
    calls: list[tuple[str, object]] = []

    class C10d:
        def _dump_nccl_trace(self, *args: object) -> bytes:
            calls.append(("nccl", args))
            return b"nccl"

        def _dump_fr_trace(self, **kwargs: object) -> bytes:
            calls.append(("fr", kwargs))
            return b"fr"

    class Dist:
        def __init__(self, backend: str) -> None:
            self.backend = backend

        def get_backend(self) -> str:
            return self.backend

    assert _raw_dump(C10d(), Dist("nccl"), False) == b"nccl"
    assert _raw_dump(C10d(), Dist("gloo"), True) == b"fr"
    assert calls == [("nccl", (True, False, False)), ("fr", {"includeStackTraces": True})]


def test_a_failed_dump_turns_the_dumps_off_not_the_agent(tmp_path):
    from stalldoc.agent.state_reader import read_state
    from stalldoc.agent.statefile import STATUS_DISABLED
    proc, pid = start(tmp_path, "plain")
    try:
        (tmp_path / "flight").rmdir()   # nowhere to write the dump
        probe = FlightDumps(tmp_path / "agents", tmp_path / "flight", wait=2)
        probe.request({0: pid})
        assert probe.collect() == {}
        state = tmp_path / "agents" / f"agent-{pid}.state"
        beat = read_state(str(state)).heartbeat_at
        time.sleep(0.6)
        after = read_state(str(state))
    finally:
        stop(proc)
    assert "flight recorder dumps disabled" in (tmp_path / "agent-errors.log").read_text()
    assert after.heartbeat_at > beat and after.status != STATUS_DISABLED
