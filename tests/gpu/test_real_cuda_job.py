"""The real check on a GPU machine: NVML values, allocator figures and CUDA-marker progress of a
real CUDA job with an offload loop and an induced hang. Skipped where no GPU exists (CI)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from support import SCENARIOS, gpu_present, watch


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU and driver")]


def test_real_cuda_job_offload_then_hang(tmp_path):
    result = watch(tmp_path, [sys.executable, str(SCENARIOS / "cuda_offload_hang.py")],
                   "--on-stall", "kill", "--stall-timeout", "6", timeout=300)
    assert result.code == 124, result.stderr
    report = result.report()
    [gpu] = [g for g in report["gpus"] if g["ranks"] == [0]]
    assert gpu["memory_total"] > 0 and gpu["peak_memory_used"] > 256 * 2**20
    traffic = {p["phase"]: p for p in report["gpu_phases"]}
    assert traffic["offload"]["pcie_rx_bytes"] > 0 and traffic["offload"]["pcie_tx_bytes"] > 0
    [peaks] = report["watermarks"]["run"]
    assert peaks["peak_cuda_allocated_bytes"] >= 256 * 2**20
    assert peaks["peak_gpu_memory_bytes"] >= peaks["peak_cuda_reserved_bytes"]
    # the GPU reached the "generate" phase's marker, recorded before the kernel was queued (an
    # H100 showed 13 of 13); the host waits in synchronize for the kernel queued after it, and
    # the stall's verdict says so (SD203 from that: tests/gpu/test_acceptance.py, kernel_hang)
    last = [r for r in report["timeseries"]["ranks"] if r["cuda_host_marker"] is not None][-1]
    assert last["cuda_host_marker"] == last["cuda_gpu_marker"] > 0
    [stall] = report["stalls"]
    seen = stall["work"]["0"]
    assert seen["stack_kind"] == "waiting: cuda sync" and seen["gpu_util"] >= 90, seen
    fixture = os.environ.get("STALLDOC_SAVE_GPU_FIXTURE")
    if fixture:  # keep the recorded window for the rules' tests
        Path(fixture).mkdir(parents=True, exist_ok=True)
        shutil.copy(result.run_dir / "run.db", Path(fixture) / "run.db")
        (Path(fixture) / "report.json").write_text(json.dumps(report, indent=1))
