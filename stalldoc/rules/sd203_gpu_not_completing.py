"""SD203 gpu-not-completing."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model import Finding, Severity, Window
from stalldoc.rules.base import Rule, describe, rank_evidence
from stalldoc.rules.telemetry import gpus_of, mean

PENDING_SECONDS = 10.0     # the oldest marker the GPU has not reached is at least this old


class GpuNotCompleting(Rule):
    """At a stall, the GPU has not finished work the host queued long ago: a kernel or an NCCL
    collective is not completing.

    What it does
        At a stall, per rank with CUDA sync markers: the host has recorded markers the GPU has
        not reached, the oldest of them at least 10 s ago. With NVML, the GPU's utilisation says
        whether it spins (busy: an NCCL kernel waiting for a peer, or a kernel that does not
        end) or waits (idle: a stream blocked on an event that never fires).

    Why is this bad?
        The Python stack only shows where the host waits (a synchronize, a .item(), the next
        collective); the real cause is on the device. An NCCL kernel spinning at 100 %
        utilisation while its peer never joins is the classic GRPO hang signature.

    Evidence
        host marker and GPU marker (numbers and labels), how long the GPU has been behind, GPU
        utilisation, the host's frame and phase.

    Fix
        GPU busy inside a collective: find the rank that is not in it (SD101 / SD103) or the
        collective the ranks disagree on (SD102). Busy outside a collective: a kernel that does not
        end. Idle with work pending: a stream waiting on an event (from another stream or process)
        that never fires.

        For the device side, run with NCCL_DEBUG=INFO and TORCH_NCCL_DUMP_ON_TIMEOUT=1.

    References
        anchors.md (host-vs-device progress); PyTorch Flight Recorder.
    """

    code = "SD203"
    name = "gpu-not-completing"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        for rank in sorted(window.agents):
            cuda = window.agents[rank].cuda
            if cuda is None or cuda.markers_behind <= 0 or not cuda.oldest_pending_at:
                continue
            behind = window.now - cuda.oldest_pending_at
            if behind < PENDING_SECONDS:
                continue
            util = mean(s.util_gpu for samples in gpus_of(window, rank).values()
                        for s in samples[-5:])
            state = ("" if util is None else
                     f"GPU {'busy' if util >= 50 else 'idle'} at {util:.0f}%, ")
            summary = (f"rank {rank}: {state}the GPU has not completed work queued {behind:.0f} s "
                       f"ago (host at marker {cuda.host_marker} {cuda.host_label}, GPU done up to "
                       f"{cuda.gpu_marker} {cuda.gpu_label}); host {describe(window, rank)}")
            yield self.finding([rank], summary, {
                **rank_evidence(window, rank), "host_marker": cuda.host_marker,
                "host_label": cuda.host_label, "gpu_marker": cuda.gpu_marker,
                "gpu_label": cuda.gpu_label, "gpu_behind_seconds": round(behind, 1),
                "util_gpu": util})
