"""The checks' verdicts on what they read: NVML through scripted ``pynvml`` functions (the lowest
level there is without a GPU), versions and Flight Recorder from what a child reported."""
from __future__ import annotations

import os

import pynvml

from fake_pynvml import FakeGpu, FakeNvml
from stalldoc.doctor.gpus import check_nvml
from stalldoc.doctor.versions import (check_flight_recorder, check_versions, installed,
                                      version_tuple)


def test_gpus_with_readable_per_process_memory_are_ok(monkeypatch):
    FakeNvml([FakeGpu("GPU-0", processes=[(os.getpid(), 3 << 30)])]).install(monkeypatch)
    check = check_nvml()
    assert check.status == "ok" and "per-process memory readable" in check.summary
    assert check.facts["driver"] == FakeNvml.driver and check.facts["gpus"] == 1


def test_gpu_processes_this_pid_namespace_cannot_see_are_a_warning(monkeypatch):
    # GIVEN NVML inside a container listing the host's pids, one without a memory figure
    host_pid = 4_000_000   # above pid_max's default: no process here has it
    FakeNvml([FakeGpu("GPU-0", processes=[(host_pid, None), (host_pid + 1, 2 << 30)])]
             ).install(monkeypatch)
    check = check_nvml()
    assert check.status == "warning" and "--pid=host" in check.fix
    assert check.facts["foreign_pids"] == [host_pid, host_pid + 1]
    assert check.facts["memory_unknown"] == [host_pid]


def test_no_driver_at_all_is_skipped_not_a_problem(monkeypatch):
    FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    check = check_nvml()
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version")):
        assert check.status == "problem"    # a node with a driver whose NVML fails
    else:
        assert check.status == "skipped" and "no NVIDIA GPU" in check.summary


def test_versions_with_a_known_hang_bug_are_warnings_naming_the_rule():
    found = installed({"vllm": "0.6.3.post1", "ms-swift": "3.4.1", "torch": "2.5.1+cu124",
                       "nvidia-nccl-cu12": "2.21.5"}, {})
    assert found["nccl"] == "2.21.5" and "nvidia-nccl-cu12" not in found
    check = check_versions(found)
    assert check.status == "warning"
    assert check.facts["known_bugs"] == ["SD502", "SD504", "SD403"]
    assert check_versions({"vllm": "0.20.1", "torch": "2.13.0"}).status == "ok"
    assert check_versions({}).status == "skipped"
    # NCCL as torch runs it wins over the wheel's metadata
    assert installed({"nvidia-nccl-cu12": "2.21.5"}, {"nccl": "2.18.1"})["nccl"] == "2.18.1"


def test_version_numbers_are_read_as_numbers():
    assert version_tuple("2.13.0+cu128") == (2, 13, 0)
    assert version_tuple("0.10.1rc1") == (0, 10, 1)
    assert version_tuple("0.6.3.post1") < (0, 7, 2) < version_tuple("0.10")


def test_flight_recorder_availability():
    assert check_flight_recorder({}).status == "skipped"
    old = check_flight_recorder({"torch": "2.1.0", "fr_nccl": False, "fr_any": False})
    assert old.status == "warning"
    both = check_flight_recorder({"torch": "2.13.0", "fr_nccl": True, "fr_any": True})
    assert both.status == "ok" and "NCCL and other backends" in both.summary
