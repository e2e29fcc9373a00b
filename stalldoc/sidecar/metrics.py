"""The Prometheus exporter: ``/metrics`` from a custom collector on its own registry.

The watcher publishes a frozen ``MetricsState`` once per tick (one reference swap); the collector
turns the latest one into metric families at scrape time, so a scrape never waits for the
watcher and never sees half a tick. Metric names are a contract (dashboards and alerts use them):
base units, bounded labels, and an info metric with run id, node and job name, never arguments.
Watchers of one job on many nodes share a run directory: its name is their common ``run_id`` (the
key that joins their ranks across nodes), ``node_name`` tells the nodes apart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    InfoMetricFamily, Metric)
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from stalldoc.analysis.phase_shares import StepShares
from stalldoc.errors import StalldocError
from stalldoc.launch.config import LaunchConfig
from stalldoc.model.samples import GpuSample, ProbeRun
from stalldoc.redact import redact_text


@dataclass(frozen=True)
class MetricsState:
    """What the exporter shows: the watcher's latest tick."""

    run_id: str
    node: str
    job: str
    since_progress: Mapping[int, float] = field(default_factory=dict)
    phases: Mapping[int, str] = field(default_factory=dict)
    collective_seq: Mapping[tuple[int, str], int] = field(default_factory=dict)
    rss: Mapping[int, int] = field(default_factory=dict)
    stall_active: bool = False
    findings: Mapping[tuple[str, str], int] = field(default_factory=dict)   # opened (ledger)
    gpus: tuple[GpuSample, ...] = ()
    gpu_peaks: Mapping[int, int] = field(default_factory=dict)
    probes: tuple[ProbeRun, ...] = ()
    open_findings: Mapping[tuple[str, str], int] = field(default_factory=dict)   # open (ledger)
    node_name: str = ""   # the node's subdirectory of a shared run directory; "" for one node
    c10d_issued: Mapping[int, int] = field(default_factory=dict)   # rank -> by sequence numbers
    shares: Mapping[int, StepShares] = field(default_factory=dict)   # rank -> its last cycles


def _shares(s: MetricsState) -> Iterator[Metric]:
    share = GaugeMetricFamily(
        "stalldoc_rank_phase_share",
        "Share of the rank's last complete cycles (rollout to rollout) spent in each kind of "
        "phase: train, rollout, generate, reward, weight_sync, offload, waiting, other",
        labels=["rank", "phase"])
    cycle = GaugeMetricFamily("stalldoc_rank_cycle_seconds",
                              "Mean length of the rank's last complete cycles", labels=["rank"])
    for rank, shares in sorted(s.shares.items()):
        for name, value in shares.shares:
            share.add_metric([str(rank), name], round(value, 4))
        cycle.add_metric([str(rank)], round(shares.cycle_seconds, 3))
    yield from (share, cycle)


def job_name(config: LaunchConfig | None) -> str:
    """``swift rlhf`` or the script / module name: never its arguments (and redacted: the
    sub-command is just the word after ``swift``)."""
    if config is None:
        return ""
    if config.launcher == "swift":
        return redact_text(f"swift {config.swift_command or ''}".strip())
    return redact_text(os.path.basename(config.program) or config.launcher)


class StateCollector(Collector):
    def __init__(self, state: MetricsState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state
        yield from self._ranks(s)
        yield from self._gpus(s)
        yield from self._run(s)

    @staticmethod
    def _ranks(s: MetricsState) -> Iterator[Metric]:
        since = GaugeMetricFamily("stalldoc_rank_seconds_since_progress",
                                  "Seconds since the rank last made progress", labels=["rank"])
        phase = GaugeMetricFamily("stalldoc_rank_phase", "1 for the phase the rank is in now",
                                  labels=["rank", "phase"])
        seq = GaugeMetricFamily("stalldoc_rank_collective_seq",
                                "Collectives the rank started in the process group",
                                labels=["rank", "group"])
        rss = GaugeMetricFamily("stalldoc_rank_host_rss_bytes", "Resident memory of the rank",
                                labels=["rank"])
        c10d = GaugeMetricFamily(
            "stalldoc_rank_c10d_collectives_issued",
            "Collectives issued on the rank's process groups, by the groups' own sequence "
            "numbers (DDP's C++ all-reduces included)", labels=["rank"])
        for rank, seconds in sorted(s.since_progress.items()):
            since.add_metric([str(rank)], seconds)
        for rank, name in sorted(s.phases.items()):
            phase.add_metric([str(rank), name or "none"], 1.0)
        for (rank, group), value in sorted(s.collective_seq.items()):
            seq.add_metric([str(rank), group], value)
        for rank, value in sorted(s.rss.items()):
            rss.add_metric([str(rank)], value)
        for rank, value in sorted(s.c10d_issued.items()):
            c10d.add_metric([str(rank)], value)
        yield from (since, phase, seq, rss, c10d)
        yield from _shares(s)

    @staticmethod
    def _gpus(s: MetricsState) -> Iterator[Metric]:
        used = GaugeMetricFamily("stalldoc_gpu_memory_used_bytes", "GPU memory in use",
                                 labels=["gpu"])
        peak = GaugeMetricFamily("stalldoc_gpu_memory_peak_bytes",
                                 "Highest GPU memory in use seen in this run", labels=["gpu"])
        util = GaugeMetricFamily("stalldoc_gpu_utilization_ratio", "GPU busy ratio (0-1)",
                                 labels=["gpu"])
        pcie = GaugeMetricFamily("stalldoc_gpu_pcie_bytes_per_second", "PCIe traffic",
                                 labels=["gpu", "direction"])
        for gpu in s.gpus:
            label = str(gpu.index)
            if gpu.memory_used is not None:
                used.add_metric([label], gpu.memory_used)
            if gpu.util_gpu is not None:
                util.add_metric([label], gpu.util_gpu / 100.0)
            for direction, value in (("tx", gpu.pcie_tx_bps), ("rx", gpu.pcie_rx_bps)):
                if value is not None:
                    pcie.add_metric([label, direction], value)
        for index, value in sorted(s.gpu_peaks.items()):
            peak.add_metric([str(index)], value)
        yield from (used, peak, util, pcie)

    @staticmethod
    def _run(s: MetricsState) -> Iterator[Metric]:
        yield GaugeMetricFamily("stalldoc_stall_active", "1 while a stall is going on",
                                value=1.0 if s.stall_active else 0.0)
        findings = CounterMetricFamily("stalldoc_findings", "Findings opened, by code and severity",
                                       labels=["code", "severity"])
        for (code, severity), count in sorted(s.findings.items()):
            findings.add_metric([code, severity], count)
        yield findings
        still = GaugeMetricFamily("stalldoc_findings_open", "Findings open now: not resolved "
                                  "(the run's findings ledger; as resolved_at IS NULL in the "
                                  "run database)", labels=["code", "severity"])
        for (code, severity), count in sorted(s.open_findings.items()):
            still.add_metric([code, severity], count)
        yield still
        ok = GaugeMetricFamily("stalldoc_probe_success", "1 when the probe's last run worked",
                               labels=["probe"])
        took = GaugeMetricFamily("stalldoc_probe_duration_seconds", "The probe's last run took",
                                 labels=["probe"])
        for run in s.probes:
            ok.add_metric([run.probe], 1.0 if run.ok else 0.0)
            took.add_metric([run.probe], run.seconds)
        yield from (ok, took)
        info = InfoMetricFamily("stalldoc_run", "The watched run")
        info.add_metric([], {"run_id": s.run_id, "node": s.node, "job_name": s.job,
                             "node_name": s.node_name})
        yield info


class Exporter:
    """Serves ``/metrics`` on ADDR:PORT; ``publish`` swaps in a new state."""

    def __init__(self, port: int, addr: str, state: MetricsState) -> None:
        self.collector = StateCollector(state)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self.server, self.thread = start_http_server(port, addr, registry)
        except OSError as exc:
            raise StalldocError(f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from exc
        self.port = self.server.server_port

    def publish(self, state: MetricsState) -> None:
        self.collector.state = state

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
