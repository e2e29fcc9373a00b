"""NVML probe (nvidia-ml-py, imported as ``pynvml``): per GPU every tick, memory used / total,
utilisation (GPU and memory; and the share of time a kernel ran, from GPM where the GPU has it:
``gpm.py``), PCIe TX/RX bytes per second, power, and the processes on it.

No library, no driver or no GPU: ``start`` says why once and the probe stays off. Every field is
read on its own, so a field this GPU or driver refuses is None ("unknown") and never costs the
others. PCIe traffic comes from the cumulative byte counters where the driver keeps them 64 bits
wide (exact), else from NVML's sampled throughput (KB/s over a short window). An H100 with driver
580 keeps them 32 bits wide: they wrap every 4 GiB, about ten times a second at full PCIe 5
speed, so no two readings a tick apart can say how much moved between them.

NVML's sampled throughput measures for 20 ms inside the call (about 21 ms of waiting, under 1 ms of
CPU, on an H200 with driver 580), and TX and RX are two calls: read one after another, 8 GPUs would
hold each tick for about 340 ms. The reads of all GPUs wait together instead, on a few threads of
this probe's own (NVML is thread-safe, and the wait releases the GIL), so a tick waits about 21 ms
whatever the number of GPUs.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from stalldoc.model.samples import GpuProcess, GpuSample
from stalldoc.probes.gpm import ComputeActivity

try:
    import pynvml
except ImportError:  # pragma: no cover - a dependency; kept so the watcher runs without it
    pynvml = None  # type: ignore[assignment]

T = TypeVar("T")
_COUNTERS = ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
_WAITERS = 16    # threads that wait for sampled throughput at once (two per GPU, up to 8 GPUs)
_WIDE = ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "NVML_VALUE_TYPE_UNSIGNED_LONG",
         "NVML_VALUE_TYPE_SIGNED_LONG_LONG")    # counters that do not wrap within a run


def _read(fn: Callable[..., T], *args: Any) -> T | None:
    """One NVML call; None when NVML refuses it (not supported, no permission, GPU lost...)."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _kib(value: int | None) -> float | None:
    return value * 1024.0 if value is not None else None


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class NvmlProbe:
    name = "nvml"

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.unavailable = ""
        self._counts: dict[int, tuple[float, int, int]] = {}   # gpu -> (t, tx bytes, rx bytes)
        self._compute = ComputeActivity()
        self._pool: ThreadPoolExecutor | None = None

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
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            _read(pynvml.nvmlShutdown)
            self.handles = []

    def driver_version(self) -> str | None:
        """The NVIDIA driver's version (None: NVML off or refusing)."""
        if not self.handles:
            return None
        return _text(_read(pynvml.nvmlSystemGetDriverVersion))

    def sample(self, now: float) -> list[GpuSample]:
        pcie = self._pcie_all(now)
        return [self._gpu(now, index, handle, pcie[index])
                for index, handle in enumerate(self.handles)]

    def _gpu(self, now: float, index: int, handle: Any,
             pcie: tuple[float | None, float | None]) -> GpuSample:
        memory = _read(pynvml.nvmlDeviceGetMemoryInfo, handle)
        util = _read(pynvml.nvmlDeviceGetUtilizationRates, handle)
        power = _read(pynvml.nvmlDeviceGetPowerUsage, handle)
        return GpuSample(
            now, index, _text(_read(pynvml.nvmlDeviceGetUUID, handle)),
            _text(_read(pynvml.nvmlDeviceGetName, handle)),
            memory.used if memory else None, memory.total if memory else None,
            util.gpu if util else None, util.memory if util else None, *pcie,
            power / 1000.0 if power is not None else None, self._processes(handle),
            self._compute.percent(index, handle))

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        procs = _read(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if procs is None:
            return None
        return tuple(GpuProcess(p.pid, p.usedGpuMemory) for p in procs)

    def _pcie_all(self, now: float) -> list[tuple[float | None, float | None]]:
        """PCIe TX/RX bytes per second of every GPU: from the counters where they serve, else
        from the sampled throughput, all GPUs' reads waiting at once."""
        rates: list[tuple[float | None, float | None] | None] = [
            self._counted(now, index, handle) for index, handle in enumerate(self.handles)]
        waits = {index: self._throughput(handle)
                 for index, handle in enumerate(self.handles) if rates[index] is None}
        for index, (tx, rx) in waits.items():
            rates[index] = _kib(tx.result()), _kib(rx.result())
        return [rate or (None, None) for rate in rates]

    def _counted(self, now: float, index: int,
                 handle: Any) -> tuple[float | None, float | None] | None:
        """The rate from the cumulative counters (None: this GPU has none wide enough)."""
        counts = self._counters(handle)
        if counts is None:
            return None
        last = self._counts.get(index)
        self._counts[index] = (now, *counts)
        if last is None or now <= last[0]:
            return None, None
        dt, tx, rx = now - last[0], counts[0] - last[1], counts[1] - last[2]
        if tx < 0 or rx < 0:
            return None, None     # the counters were reset (driver reload)
        return tx / dt, rx / dt

    def _throughput(self, handle: Any) -> tuple[Future[int | None], Future[int | None]]:
        """NVML's sampled TX and RX throughput of one GPU (KiB/s), both reads under way."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_WAITERS, thread_name_prefix="stalldoc-nvml")
        read = pynvml.nvmlDeviceGetPcieThroughput
        return (self._pool.submit(_read, read, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES),
                self._pool.submit(_read, read, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES))

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
