"""Cost of one NVML tick for all GPUs of the node (every field of every GPU, processes mapped):
how long the tick holds the watcher (wall time) and the CPU it spends (this process's CPU time,
the probe's waiting threads included). The baseline, measured in the same run, is the same probe
reading each GPU's sampled PCIe throughput (a 20 ms window inside each NVML call) in turn, as it
did before it read them for all GPUs at once. Needs an NVIDIA driver; without one it says
why and exits 0.

    python benchmarks/nvml_tick.py [TICKS]
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.probes.nvml import NvmlProbe, _read  # noqa: E402


class OneAfterAnother(NvmlProbe):
    """The baseline: the same probe, with each sampled-throughput read made in turn."""

    def _throughput(self, handle: Any) -> tuple[Future[int | None], Future[int | None]]:
        import pynvml
        done: list[Future[int | None]] = []
        for counter in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            done.append(Future())
            done[-1].set_result(_read(pynvml.nvmlDeviceGetPcieThroughput, handle, counter))
        return done[0], done[1]


def timed(ticks: int, tick: Callable[[], object]) -> tuple[float, float]:
    """Mean wall and CPU seconds of one tick."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(ticks):
        tick()
    return (time.perf_counter() - wall) / ticks, (time.process_time() - cpu) / ticks


def main() -> None:
    ticks = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    probe, baseline = NvmlProbe(), OneAfterAnother()
    why = probe.start() or baseline.start()
    if why:
        print(f"no GPU telemetry on this machine: {why}")
        return
    probe.sample(time.time())   # first readings (PCIe counters and GPM need two)
    baseline.sample(time.time())
    rounds = [(timed(ticks, lambda: probe.sample(time.time())),
               timed(ticks, lambda: baseline.sample(time.time()))) for _ in range(3)]
    (wall, cpu), (base_wall, base_cpu) = (
        tuple(sum(r[side][part] for r in rounds) / 3 for part in (0, 1)) for side in (0, 1))
    samples = probe.sample(time.time())
    count = len(samples)
    unknown = sorted({name for s in samples for name, v in vars(s).items() if v is None})
    print(f"{count} GPU(s), one tick: holds the watcher {wall * 1e3:.2f} ms "
          f"(reads one after another: {base_wall * 1e3:.2f} ms; ratio {wall / base_wall:.2f}), "
          f"CPU {cpu * 1e3:.2f} ms (one after another: {base_cpu * 1e3:.2f} ms; ratio "
          f"{cpu / max(base_cpu, 1e-9):.2f}); fields unknown here: {unknown or 'none'}")
    print(f"at --interval 1: {cpu * 100:.2f}% of one core, and the tick waits "
          f"{wall * 100:.1f}% of its interval on NVML")
    probe.stop()
    baseline.stop()


if __name__ == "__main__":
    main()
