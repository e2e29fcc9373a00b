"""NVML probe (nvidia-ml-py, imported as ``pynvml``): per GPU every tick, memory used / total,
utilisation (GPU and memory; and the share of time a kernel ran, from GPM where the GPU has it:
``gpm.py``), PCIe TX/RX bytes per second, power, and the processes on it.

No library, no driver or no GPU: ``start`` says why once and the probe stays off. Every field is
read on its own, so a field this GPU or driver refuses is None ("unknown") and never costs the
others. PCIe traffic comes from the cumulative byte counters where the driver keeps them 64 bits
wide (exact), else from NVML's sampled throughput (KB/s over a short window). An H100 with driver
580 keeps them 32 bits wide: they wrap every 4 GiB, about ten times a second at full PCIe 5
speed, so no two readings a tick apart can say how much moved between them.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from stalldoc.model.samples import GpuProcess, GpuSample
from stalldoc.probes.gpm import ComputeActivity

try:
    import pynvml
except ImportError:  # pragma: no cover - a dependency; kept so the watcher runs without it
    pynvml = None  # type: ignore[assignment]

T = TypeVar("T")
_COUNTERS = ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
_WIDE = ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "NVML_VALUE_TYPE_UNSIGNED_LONG",
         "NVML_VALUE_TYPE_SIGNED_LONG_LONG")    # counters that do not wrap within a run


def _read(fn: Callable[..., T], *args: Any) -> T | None:
    """One NVML call; None when NVML refuses it (not supported, no permission, GPU lost...)."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class NvmlProbe:
    name = "nvml"

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.unavailable = ""
        self._counts: dict[int, tuple[float, int, int]] = {}   # gpu -> (t, tx bytes, rx bytes)
        self._compute = ComputeActivity()

    def start(self) -> str:
        """Initialise NVML; returns why it cannot be used ("" when it can)."""
        if pynvml is None:
            self.unavailable = "nvidia-ml-py is not installed"
            return self.unavailable
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.unavailable = f"NVML unavailable: {exc}"
            return self.unavailable
        if not self.handles:
            self.unavailable = "NVML sees no GPU"
        return self.unavailable

    def stop(self) -> None:
        if self.handles:
            self._compute.close()
            _read(pynvml.nvmlShutdown)
            self.handles = []

    def driver_version(self) -> str | None:
        """The NVIDIA driver's version (None: NVML off or refusing)."""
        if not self.handles:
            return None
        return _text(_read(pynvml.nvmlSystemGetDriverVersion))

    def sample(self, now: float) -> list[GpuSample]:
        return [self._gpu(now, index, handle) for index, handle in enumerate(self.handles)]

    def _gpu(self, now: float, index: int, handle: Any) -> GpuSample:
        memory = _read(pynvml.nvmlDeviceGetMemoryInfo, handle)
        util = _read(pynvml.nvmlDeviceGetUtilizationRates, handle)
        power = _read(pynvml.nvmlDeviceGetPowerUsage, handle)
        tx, rx = self._pcie(now, index, handle)
        return GpuSample(
            now, index, _text(_read(pynvml.nvmlDeviceGetUUID, handle)),
            _text(_read(pynvml.nvmlDeviceGetName, handle)),
            memory.used if memory else None, memory.total if memory else None,
            util.gpu if util else None, util.memory if util else None, tx, rx,
            power / 1000.0 if power is not None else None, self._processes(handle),
            self._compute.percent(index, handle))

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        procs = _read(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if procs is None:
            return None
        return tuple(GpuProcess(p.pid, p.usedGpuMemory) for p in procs)

    def _pcie(self, now: float, index: int, handle: Any) -> tuple[float | None, float | None]:
        counts = self._counters(handle)
        if counts is not None:
            last = self._counts.get(index)
            self._counts[index] = (now, *counts)
            if last is None or now <= last[0]:
                return None, None
            dt, tx, rx = now - last[0], counts[0] - last[1], counts[1] - last[2]
            if tx < 0 or rx < 0:
                return None, None     # the counters were reset (driver reload)
            return tx / dt, rx / dt
        tx = _read(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = _read(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return (tx * 1024.0 if tx is not None else None), (rx * 1024.0 if rx is not None else None)

    def _counters(self, handle: Any) -> tuple[int, int] | None:
        """The cumulative PCIe TX/RX byte counters, or None where the driver lacks them or keeps
        them too narrow to read a tick apart."""
        ids = [getattr(pynvml, name, None) for name in _COUNTERS]
        if None in ids:
            return None
        values = _read(pynvml.nvmlDeviceGetFieldValues, handle, ids)
        wide = {getattr(pynvml, name, -1) for name in _WIDE}
        if values is None or any(v.nvmlReturn != pynvml.NVML_SUCCESS or v.valueType not in wide
                                 for v in values):
            return None
        return int(values[0].value.ullVal), int(values[1].value.ullVal)
