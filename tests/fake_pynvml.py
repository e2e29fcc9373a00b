"""Scripted stand-ins for the ``pynvml`` functions the NVML probe calls: the lowest level there is
on a machine without a GPU. Everything above them (the probe, the sampler, the store, the report)
runs for real. Failures are real ``pynvml.NVMLError`` values."""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    uuid: str = "GPU-0000"
    name: str = "NVIDIA H100 80GB HBM3"
    used: int = 0
    total: int = 80 * 2**30
    util: int = 0
    util_memory: int = 0
    power_mw: int = 70000
    tx_bytes: int = 0            # cumulative PCIe counters
    rx_bytes: int = 0
    tx_kbps: int = 0             # sampled throughput
    rx_kbps: int = 0
    processes: Any = field(default_factory=list)   # [(pid, used)], or a function giving them
    counters: bool = True        # does the driver have the cumulative counters?
    counter_type: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG   # H100, driver 580: UNSIGNED_INT
    compute: float | None = None  # GPM graphics-engine activity, percent (None: no GPM)
    broken: set[str] = field(default_factory=set)   # functions that raise NOT_SUPPORTED
    throughput_wait: float = 0.0  # seconds the sampled throughput measures for (NVML: 0.02)


class FakeNvml:
    """Install with ``install(monkeypatch)``; edit ``gpus`` between samples."""

    driver = "550.54.15"

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[str] = []
        self.measuring = 0             # sampled-throughput reads under way now, and the most seen
        self.most_measuring = 0
        self._lock = threading.Lock()

    def install(self, monkeypatch: Any) -> None:
        for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                     "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
                     "nvmlDeviceGetPowerUsage", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
                     "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetPcieThroughput",
                     "nvmlDeviceGetFieldValues", "nvmlSystemGetDriverVersion",
                     "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet",
                     "nvmlGpmSampleFree", "nvmlGpmMetricsGet"):
            monkeypatch.setattr(pynvml, name, self._wrap(name, getattr(self, name[4:])))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            gpu = args[0] if args and isinstance(args[0], FakeGpu) else None
            if gpu is not None and name in gpu.broken:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return fn(*args)
        return call

    def Init(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def Shutdown(self) -> None:
        pass

    def SystemGetDriverVersion(self) -> str:
        return self.driver

    def DeviceGetCount(self) -> int:
        return len(self.gpus)

    def DeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def DeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:
        return SimpleNamespace(used=gpu.used, total=gpu.total, free=gpu.total - gpu.used)

    def DeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        return SimpleNamespace(gpu=gpu.util, memory=gpu.util_memory)

    def DeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return gpu.power_mw

    def DeviceGetUUID(self, gpu: FakeGpu) -> str:
        return gpu.uuid

    def DeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def DeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:
        held = gpu.processes() if callable(gpu.processes) else gpu.processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in held]

    def DeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> int:
        with self._lock:
            self.measuring += 1
            self.most_measuring = max(self.most_measuring, self.measuring)
        time.sleep(gpu.throughput_wait)       # NVML counts bytes over a window inside the call
        with self._lock:
            self.measuring -= 1
        return gpu.tx_kbps if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.rx_kbps

    def DeviceGetFieldValues(self, gpu: FakeGpu, ids: list[int]) -> list[Any]:
        values = {pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: gpu.tx_bytes,
                  pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: gpu.rx_bytes}
        status = pynvml.NVML_SUCCESS if gpu.counters else pynvml.NVML_ERROR_NOT_SUPPORTED
        narrow = gpu.counter_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT   # the union's 32 bits
        return [SimpleNamespace(nvmlReturn=status, valueType=gpu.counter_type, value=SimpleNamespace(
            ullVal=values[i] % 2**32 if narrow else values[i], uiVal=values[i] % 2**32))
                for i in ids]

    # GPM: a sample (an opaque pointer, as NVML's) records the GPU's activity so far; a metric
    # compares two samples, filled into pynvml's own request structure
    def GpmQueryDeviceSupport(self, gpu: FakeGpu) -> Any:
        return SimpleNamespace(isSupportedDevice=int(gpu.compute is not None))

    def GpmSampleAlloc(self) -> Any:
        self._samples = getattr(self, "_samples", {})
        address = 0x1000 * (len(self._samples) + 1)
        self._samples[address] = (None, None)
        return ctypes.cast(address, pynvml.c_nvmlGpmSample_t)

    def GpmSampleGet(self, gpu: FakeGpu, sample: Any) -> Any:
        self._samples[_address(sample)] = (gpu, gpu.compute)
        return sample

    def GpmSampleFree(self, sample: Any) -> None:
        del self._samples[_address(sample)]

    def GpmMetricsGet(self, request: Any) -> Any:
        (first, _), (second, compute) = (self._samples[_address(request.sample1)],
                                         self._samples[_address(request.sample2)])
        assert first is second and request.numMetrics == 1
        assert request.metrics[0].metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        request.metrics[0].nvmlReturn = pynvml.NVML_SUCCESS
        request.metrics[0].value = compute          # the activity since the first sample
        return request


def _address(sample: Any) -> int:
    return ctypes.cast(sample, ctypes.c_void_p).value or 0
