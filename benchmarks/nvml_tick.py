"""Cost of one NVML tick for all GPUs of the node (every field of every GPU, processes mapped),
against the cheapest NVML call (device count) measured in the same run. Needs an NVIDIA driver;
without one it says why and exits 0.

    python benchmarks/nvml_tick.py [TICKS]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.probes.nvml import NvmlProbe  # noqa: E402


def main() -> None:
    ticks = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    probe = NvmlProbe()
    why = probe.start()
    if why:
        print(f"no GPU telemetry on this machine: {why}")
        return
    import pynvml
    probe.sample(time.time())   # first reading (PCIe counters need two)
    t0 = time.perf_counter()
    for _ in range(ticks):
        samples = probe.sample(time.time())
    tick = (time.perf_counter() - t0) / ticks
    t0 = time.perf_counter()
    for _ in range(ticks):
        pynvml.nvmlDeviceGetCount()
    base = (time.perf_counter() - t0) / ticks
    unknown = sorted({name for s in samples for name, v in vars(s).items() if v is None})
    print(f"{len(samples)} GPU(s): one NVML tick {tick * 1e3:.2f} ms "
          f"({tick / len(samples) * 1e3:.2f} ms per GPU; {tick / base:.0f}x one nvmlDeviceGetCount"
          f" = {base * 1e6:.1f} us); fields unknown here: {unknown or 'none'}")
    print(f"at --interval 1 that is {tick * 100:.2f}% of one core")
    probe.stop()


if __name__ == "__main__":
    main()
