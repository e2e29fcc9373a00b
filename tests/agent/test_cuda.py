"""CUDA telemetry in the agent: inert in a real torch process without CUDA; with CUDA, markers
and allocator figures reach the state file. Without a GPU here, the CUDA case scripts the
``torch.cuda`` calls the agent makes (Event, is_initialized, is_current_stream_capturing,
device_count, memory_stats) and the one CUDA driver call (the thread's capture mode), and nothing
above them; the real check runs on a GPU machine (tests marked ``gpu``)."""
from __future__ import annotations

import os
import sys
import textwrap
import threading
from types import SimpleNamespace

import pytest

from stalldoc.agent import cuda as cuda_telemetry
from stalldoc.agent import runtime
from stalldoc.agent.statefile import state_path
from stalldoc.agent.state_reader import read_state

JOB = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    import stalldoc
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
    for _ in range(3):
        with stalldoc.phase("step"):
            dist.all_reduce(torch.ones(4))
    torch.cuda.is_available()   # asks, never initialises
    time.sleep(0.8)             # a few agent-thread ticks
    print(os.getpid())
""")


def test_inert_in_a_torch_process_without_cuda(tmp_path):
    from support import free_port, run_with_agent
    state = run_with_agent(tmp_path, JOB % free_port())
    assert state.cuda is None
    assert state.collective_seq == 3 and state.phases_completed == 3
    assert not (tmp_path / "agent-errors.log").exists()


class ScriptedEvent:
    """Stands in for torch.cuda.Event: complete once the scripted GPU has reached it."""

    gpu_done = 0
    recorded = 0

    def __init__(self) -> None:
        self.at = 0

    def record(self) -> None:
        ScriptedEvent.recorded += 1
        self.at = ScriptedEvent.recorded

    def query(self) -> bool:
        return self.at <= ScriptedEvent.gpu_done


def scripted_torch(initialised: bool) -> SimpleNamespace:
    stats = {"allocated_bytes.all.current": 3 << 30, "reserved_bytes.all.current": 5 << 30,
             "allocated_bytes.all.peak": 4 << 30, "num_alloc_retries": 2, "num_ooms": 0}
    cuda = SimpleNamespace(is_initialized=lambda: initialised, Event=ScriptedEvent,
                           device_count=lambda: 1, memory_stats=lambda device: stats,
                           capturing=False)
    cuda.is_current_stream_capturing = lambda: cuda.capturing
    return SimpleNamespace(cuda=cuda)


class ScriptedDriver:
    """Stands in for libcuda's cuThreadExchangeStreamCaptureMode: which thread set which mode."""

    def __init__(self) -> None:
        self.modes: list[tuple[int, int]] = []

    def cuThreadExchangeStreamCaptureMode(self, mode) -> int:  # noqa: N802 - the C name
        self.modes.append((threading.get_ident(), mode._obj.value))
        mode._obj.value = 0                 # the previous mode: global
        return 0


@pytest.fixture
def driver(monkeypatch) -> ScriptedDriver:
    scripted = ScriptedDriver()
    monkeypatch.setattr(cuda_telemetry, "driver", lambda: scripted)
    return scripted


@pytest.fixture
def agent(tmp_path, monkeypatch, driver):
    monkeypatch.setattr(ScriptedEvent, "gpu_done", 0)
    monkeypatch.setattr(ScriptedEvent, "recorded", 0)
    (tmp_path / "agents").mkdir()
    agent = runtime.Agent(str(tmp_path / "agents"))
    yield agent
    agent.state.close()


def test_no_markers_until_the_job_initialised_cuda(agent, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", scripted_torch(initialised=False))
    agent._cuda_tick(1.0, allocator=True)
    agent.phase_enter("rollout")
    assert agent.cuda is None and ScriptedEvent.recorded == 0
    assert read_state(state_path(agent.directory, agent.pid)).cuda is None


def test_host_ahead_of_gpu_is_published(agent, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", scripted_torch(initialised=True))
    agent._cuda_tick(10.0, allocator=True)              # attaches
    for name in ("rollout", "train"):
        agent.phase_enter(name)
    agent.cuda.mark("collective", b"all_reduce", 7)
    ScriptedEvent.gpu_done = 2                           # GPU finished up to "train"
    agent._cuda_tick(11.0, allocator=True)
    cuda = read_state(state_path(agent.directory, agent.pid)).cuda
    assert (cuda.host_marker, cuda.gpu_marker, cuda.markers_behind) == (3, 2, 1)
    assert (cuda.host_label, cuda.gpu_label, cuda.gpu_done_at) == ("all_reduce#7", "phase train",
                                                                   11.0)
    assert cuda.oldest_pending_at > 0
    assert (cuda.allocated, cuda.reserved, cuda.peak_allocated, cuda.alloc_retries,
            cuda.ooms) == (3 << 30, 5 << 30, 4 << 30, 2, 0)
    ScriptedEvent.gpu_done = 3
    agent._cuda_tick(12.0, allocator=False)
    cuda = read_state(state_path(agent.directory, agent.pid)).cuda
    assert (cuda.markers_behind, cuda.oldest_pending_at) == (0, 0.0)
    assert len(agent.cuda.pool) == 3                     # events are reused


def test_broken_cuda_turns_markers_off_and_keeps_the_agent(agent, monkeypatch):
    torch = scripted_torch(initialised=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    agent._cuda_tick(1.0, allocator=True)

    def broken() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    torch.cuda.Event = broken
    agent.phase_enter("step")                             # the hot path does not raise
    agent._cuda_tick(2.0, allocator=False)
    assert agent.cuda is None and agent.enabled
    log = open(os.path.join(os.path.dirname(agent.directory), runtime.ERROR_LOG)).read()
    assert "CUDA telemetry disabled" in log and "illegal memory access" in log
    agent.phase_enter("next")
    assert read_state(state_path(agent.directory, agent.pid)).phase_stack == ("step", "next")


def test_graph_capture_gets_no_marker_and_the_agent_thread_queries_relaxed(agent, driver,
                                                                          monkeypatch):
    # GIVEN a job that captures a CUDA graph (vLLM at start-up) with a phase inside the capture
    torch = scripted_torch(initialised=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    agent._cuda_tick(1.0, allocator=True)              # attaches, on this (the agent's) thread
    agent.phase_enter("generate")
    torch.cuda.capturing = True
    agent.phase_enter("capture_graph")                  # inside the capture: no event recorded
    torch.cuda.capturing = False
    agent.phase_exit("capture_graph")
    agent.phase_enter("decode")
    # THEN only the markers outside the capture exist, and the agent thread set the relaxed
    # mode (CU_STREAM_CAPTURE_MODE_RELAXED) for itself before its first event query
    assert ScriptedEvent.recorded == agent.cuda.host_seq == 2
    assert agent.cuda.host_label == ("phase", "decode", agent.marker_seq)
    assert driver.modes == [(threading.get_ident(), cuda_telemetry.RELAXED)]


def test_no_driver_for_the_capture_mode_keeps_markers_off_and_the_allocator_on(agent,
                                                                                monkeypatch):
    def missing():
        raise OSError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(cuda_telemetry, "driver", missing)
    monkeypatch.setitem(sys.modules, "torch", scripted_torch(initialised=True))
    agent._cuda_tick(1.0, allocator=True)
    agent.phase_enter("step")
    agent._cuda_tick(2.0, allocator=True)
    assert ScriptedEvent.recorded == 0 and agent.cuda is not None
    cuda = read_state(state_path(agent.directory, agent.pid)).cuda
    assert (cuda.host_marker, cuda.allocated) == (0, 3 << 30)
    log = open(os.path.join(os.path.dirname(agent.directory), runtime.ERROR_LOG)).read()
    assert log.count("CUDA markers off") == 1 and "cannot open shared object" in log


def test_marker_backlog_is_bounded(monkeypatch):
    monkeypatch.setattr(cuda_telemetry, "MAX_PENDING", 5)
    markers = cuda_telemetry.CudaMarkers(scripted_torch(True))
    for n in range(8):
        markers.mark("phase", "p", n)
    assert markers.host_seq == 5 and len(markers.pending) == 5
