from __future__ import annotations

import pynvml
import pytest

from fake_pynvml import FakeGpu, FakeNvml
from stalldoc.probes.nvml import NvmlProbe

GiB = 2**30


def started(monkeypatch, *gpus: FakeGpu) -> tuple[NvmlProbe, FakeNvml]:
    nvml = FakeNvml(list(gpus))
    nvml.install(monkeypatch)
    probe = NvmlProbe()
    assert probe.start() == ""
    return probe, nvml


def test_every_field_of_every_gpu(monkeypatch):
    a = FakeGpu("GPU-a", used=30 * GiB, util=87, util_memory=40, power_mw=412500,
                processes=[(101, 29 * GiB), (102, None)])
    b = FakeGpu("GPU-b", used=2 * GiB, util=0)
    probe, _ = started(monkeypatch, a, b)
    first, second = probe.sample(100.0)
    assert (first.index, first.uuid, first.name) == (0, "GPU-a", "NVIDIA H100 80GB HBM3")
    assert (first.memory_used, first.memory_total) == (30 * GiB, 80 * GiB)
    assert (first.util_gpu, first.util_memory, first.power_w) == (87, 40, 412.5)
    assert [(p.pid, p.used_bytes) for p in first.processes] == [(101, 29 * GiB), (102, None)]
    assert (second.uuid, second.memory_used, second.processes) == ("GPU-b", 2 * GiB, ())


def test_pcie_rate_from_cumulative_counters(monkeypatch):
    gpu = FakeGpu(tx_bytes=10 * GiB, rx_bytes=1 * GiB)
    probe, _ = started(monkeypatch, gpu)
    [first] = probe.sample(100.0)
    assert (first.pcie_tx_bps, first.pcie_rx_bps) == (None, None)  # a rate needs two readings
    gpu.tx_bytes += 8 * GiB
    gpu.rx_bytes += 24 * GiB
    [second] = probe.sample(102.0)
    assert (second.pcie_tx_bps, second.pcie_rx_bps) == (4 * GiB, 12 * GiB)


def test_pcie_falls_back_to_sampled_throughput(monkeypatch):
    gpu = FakeGpu(counters=False, tx_kbps=2048, rx_kbps=9 * 1024 * 1024)
    probe, _ = started(monkeypatch, gpu)
    [sample] = probe.sample(100.0)
    assert (sample.pcie_tx_bps, sample.pcie_rx_bps) == (2048 * 1024, 9 * GiB)


def test_the_sampled_throughput_of_all_gpus_is_measured_at_once(monkeypatch):
    # GIVEN 4 GPUs without wide counters, whose sampled throughput waits in the call as NVML's
    # does (20 ms there; 0.3 s here, so reads one after another could not overlap by chance)
    gpus = [FakeGpu(f"GPU-{i}", counters=False, tx_kbps=i, rx_kbps=10 * i, throughput_wait=0.3)
            for i in range(4)]
    probe, nvml = started(monkeypatch, *gpus)
    # WHEN one tick reads them
    samples = probe.sample(100.0)
    # THEN all 8 reads (TX and RX of each GPU) were under way together, and each GPU got its own
    assert nvml.most_measuring == 8
    assert [(s.pcie_tx_bps, s.pcie_rx_bps) for s in samples] == [
        (i * 1024.0, 10 * i * 1024.0) for i in range(4)]
    probe.stop()
    assert nvml.measuring == 0


def test_32_bit_counters_are_not_read_as_rates(monkeypatch):
    # GIVEN the counters an H100 with driver 580 has: 32 bits wide (valueType UNSIGNED_INT), and
    # 15 GiB moved host -> GPU in half a second (pinned copies at PCIe 5 speed: 3 wraps and more)
    gpu = FakeGpu(counter_type=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, tx_bytes=540868588,
                  rx_bytes=3101817436, tx_kbps=4880853, rx_kbps=57692023)
    probe, _ = started(monkeypatch, gpu)
    [first] = probe.sample(100.0)
    gpu.tx_bytes += GiB
    gpu.rx_bytes += 15 * GiB
    [second] = probe.sample(100.5)
    # THEN the rates are NVML's sampled throughput, not a wrapped (negative, or 4 GiB short) delta
    for sample in (first, second):
        assert (sample.pcie_tx_bps, sample.pcie_rx_bps) == (4880853 * 1024, 57692023 * 1024)


def test_a_counter_reset_gives_no_rate_rather_than_a_negative_one(monkeypatch):
    gpu = FakeGpu(tx_bytes=90 * GiB, rx_bytes=70 * GiB)
    probe, _ = started(monkeypatch, gpu)
    probe.sample(100.0)
    gpu.tx_bytes, gpu.rx_bytes = GiB, GiB          # the driver was reloaded
    [reset] = probe.sample(101.0)
    assert (reset.pcie_tx_bps, reset.pcie_rx_bps) == (None, None)
    gpu.tx_bytes += 2 * GiB
    [after] = probe.sample(102.0)
    assert after.pcie_tx_bps == 2 * GiB


def test_compute_activity_from_gpm_between_two_readings(monkeypatch):
    # GIVEN a GPU with GPM: copies only (graphics engine idle), then a kernel
    gpu = FakeGpu(util=100, compute=0.0)
    probe, nvml = started(monkeypatch, gpu)
    [first] = probe.sample(1.0)
    assert first.util_compute is None and first.util_gpu == 100   # one GPM sample: no span yet
    [copying] = probe.sample(1.5)
    gpu.compute = 99.4
    [computing] = probe.sample(2.0)
    assert (copying.util_compute, computing.util_compute) == (0.0, 99.4)
    probe.stop()
    assert nvml.calls.count("nvmlGpmSampleAlloc") == 2 == nvml.calls.count("nvmlGpmSampleFree")


@pytest.mark.parametrize("gpu", [FakeGpu(compute=None),                      # before Hopper
                                 FakeGpu(compute=50.0, broken={"nvmlGpmSampleGet"})],  # refused
                         ids=["no-gpm", "gpm-refused"])
def test_no_gpm_leaves_compute_unknown_and_is_not_asked_again(monkeypatch, gpu):
    probe, nvml = started(monkeypatch, gpu)
    samples = [probe.sample(float(t))[0] for t in range(4)]
    assert [s.util_compute for s in samples] == [None] * 4
    assert all(s.util_gpu == 0 and s.memory_total for s in samples)   # the rest is read
    assert nvml.calls.count("nvmlGpmQueryDeviceSupport") == 1
    assert nvml.calls.count("nvmlGpmSampleGet") <= 1


@pytest.mark.parametrize("broken,unknown", [
    ("nvmlDeviceGetUtilizationRates", ("util_gpu", "util_memory")),
    ("nvmlDeviceGetPowerUsage", ("power_w",)),
    ("nvmlDeviceGetComputeRunningProcesses", ("processes",)),
    ("nvmlDeviceGetMemoryInfo", ("memory_used", "memory_total")),
])
def test_one_refused_field_is_unknown_and_the_others_stay(monkeypatch, broken, unknown):
    gpu = FakeGpu(used=5 * GiB, util=50, util_memory=10, processes=[(7, GiB)],
                  counters=False, tx_kbps=1, rx_kbps=1, broken={broken})
    probe, _ = started(monkeypatch, gpu)
    [sample] = probe.sample(1.0)
    fields = ("memory_used", "memory_total", "util_gpu", "util_memory", "power_w", "processes",
              "pcie_tx_bps", "uuid")
    for name in fields:
        value = getattr(sample, name)
        assert (value is None) == (name in unknown), name


@pytest.mark.parametrize("error,words", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "Library Not Found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
])
def test_no_driver_says_why_once_and_stays_off(monkeypatch, error, words):
    nvml = FakeNvml([], init_error=error)
    nvml.install(monkeypatch)
    probe = NvmlProbe()
    why = probe.start()
    assert why.startswith("NVML unavailable") and words in why
    assert probe.sample(1.0) == []
    assert nvml.calls == ["nvmlInit"]


def test_no_gpu(monkeypatch):
    FakeNvml([]).install(monkeypatch)
    assert NvmlProbe().start() == "NVML sees no GPU"


def test_the_driver_version(monkeypatch):
    probe, _ = started(monkeypatch, FakeGpu("GPU-a"))
    assert probe.driver_version() == "550.54.15"
    assert NvmlProbe().driver_version() is None    # not started: no NVML
