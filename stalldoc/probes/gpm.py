"""NVML's GPU performance monitoring (GPM, Hopper and later): the share of time a kernel ran.

NVML's ``utilization.gpu`` also counts copies: on an H100 (driver 580) it reads 100 % while the
GPU only moves pinned memory over PCIe, with no kernel at all. GPM's graphics-engine activity
(``NVML_GPM_METRIC_GRAPHICS_UTIL``) reads 0 % there, about 99 % during matrix products and
100 % for a kernel that spins; it is what tells "the GPU computes" from "the GPU copies".

GPM compares two samples of the GPU's counters: each reading takes a new sample and measures the
span since the previous one (the first reading only takes a sample). A GPU without GPM, an older
driver or a refusal (no permission) leaves the value unknown (None) for that GPU from then on.
"""
from __future__ import annotations

from typing import Any

try:
    import pynvml
except ImportError:  # pragma: no cover - a dependency
    pynvml = None  # type: ignore[assignment]


class ComputeActivity:
    """Per GPU, the percentage of time its graphics/compute engine was active between two
    readings."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}     # gpu -> its last GPM sample
        self._spare: dict[int, Any] = {}        # gpu -> a sample buffer to fill next
        self._off: set[int] = set()

    def percent(self, index: int, handle: Any) -> float | None:
        """The share of time since the last call (None: first call, or no GPM here)."""
        if pynvml is None or index in self._off:
            return None
        try:
            return self._measure(index, handle)
        except (pynvml.NVMLError, AttributeError, OSError):
            self._off.add(index)
            self._free(index)
            return None

    def _measure(self, index: int, handle: Any) -> float | None:
        previous = self._previous.get(index)
        if previous is None:
            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                raise OSError("no GPM on this GPU")
            self._previous[index] = pynvml.nvmlGpmSampleGet(handle, pynvml.nvmlGpmSampleAlloc())
            self._spare[index] = pynvml.nvmlGpmSampleAlloc()
            return None
        current = pynvml.nvmlGpmSampleGet(handle, self._spare[index])
        self._previous[index], self._spare[index] = current, previous
        return _graphics_util(previous, current)

    def close(self) -> None:
        for index in list(self._previous):
            self._free(index)

    def _free(self, index: int) -> None:
        for samples in (self._previous, self._spare):
            sample = samples.pop(index, None)
            if sample is not None:
                try:
                    pynvml.nvmlGpmSampleFree(sample)
                except pynvml.NVMLError:
                    pass


def _graphics_util(first: Any, second: Any) -> float | None:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    pynvml.nvmlGpmMetricsGet(request)
    metric = request.metrics[0]
    if metric.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    return round(min(max(float(metric.value), 0.0), 100.0), 1)
