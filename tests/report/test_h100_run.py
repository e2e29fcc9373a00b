"""A run recorded on a real H100 (driver 580, torch 2.11): ``tests/scenarios/cuda_offload_hang.py``
under ``stalldoc watch --on-stall kill --stall-timeout 6``, saved by ``tests/gpu/
test_real_cuda_job.py`` (STALLDOC_SAVE_GPU_FIXTURE). It keeps what only the device showed: PCIe
counters 32 bits wide (read as sampled throughput, never as wrapped negative rates), NVML's
utilisation counting copies, and GPM's kernel activity beside it, through the store into every
report."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stalldoc.report.build import build_report

RUN = Path(__file__).parent / "fixtures" / "h100_offload_hang"
GiB = 2**30


def test_pcie_traffic_of_the_real_device_is_whole_and_never_negative():
    report = build_report(RUN)
    rates = [(g["pcie_tx_bps"], g["pcie_rx_bps"]) for g in report["timeseries"]["gpus"]]
    assert rates and all(tx >= 0 and rx >= 0 for tx, rx in rates)
    offload = {p["phase"]: p for p in report["gpu_phases"]}["offload"]
    # 6 steps of 8 x 256 MiB each way, at the ticks the offload phase was seen in
    assert offload["pcie_rx_bytes"] > GiB and offload["pcie_tx_bytes"] > GiB


def test_kernel_activity_is_kept_beside_nvml_utilisation():
    report = build_report(RUN)
    points = report["timeseries"]["gpus"]
    assert all(p["util_compute"] is not None for p in points[1:])   # GPM: from the 2nd sample
    generate = [p for p in points if p["phase"] == "generate"]
    assert generate and all(p["util_compute"] >= 90 for p in generate[1:])   # the spinning kernel
    [gpu] = report["gpus"]
    assert gpu["util_compute_mean"] is not None and gpu["util_gpu_mean"] is not None
    [finding] = [f for f in report["findings"] if f["code"] == "SD201"]
    assert finding["evidence"]["util_compute_mean"] is not None


def test_text_report_shows_the_kernel_column():
    out = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(RUN)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    gpus = out.stdout.split("GPUs:")[1].splitlines()
    assert "kernels mean" in gpus[1] and gpus[2].split()[5].endswith("%")
