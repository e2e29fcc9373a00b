"""SD203 gpu-not-completing."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.agent import CudaState
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, describe, rank_evidence, stuck_for
from stalldoc.rules.telemetry import gpus_of, mean

PENDING_SECONDS = 10.0     # the oldest marker the GPU has not reached is at least this old
CUDA_SYNC = "waiting: cuda sync"   # the stack kind of a host blocked on the device


class GpuNotCompleting(Rule):
    """At a stall, the GPU has not finished work the host queued long ago: a kernel or an NCCL
    collective is not completing.

    What it does
        At a stall, per rank with CUDA sync markers: the host has recorded markers the GPU has
        not reached, the oldest of them at least 10 s ago. Or the GPU reached every marker but
        the host has waited at least 10 s, with nothing else moving, in a CUDA synchronisation
        (``torch.cuda.synchronize``, an event or stream wait, ``.item()``): work queued after
        the last marker is not completing (a kernel launched right before a synchronize). With
        NVML, the GPU's utilisation says whether it spins (busy: an NCCL kernel waiting for a
        peer, or a kernel that does not end) or waits (idle: a stream blocked on an event that
        never fires).

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
        PyTorch Flight Recorder (a collective started on the host, not completed on the device); DLRover's xpu-timer and SageMaker HyperPod (a hang read from flat GPU utilisation).
    """

    code = "SD203"
    name = "gpu-not-completing"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        for rank in sorted(window.agents):
            cuda = window.agents[rank].cuda
            if cuda is None:
                continue
            behind, how = _behind(window, rank, cuda)
            if behind < PENDING_SECONDS:
                continue
            util = mean(s.util_gpu for samples in gpus_of(window, rank).values()
                        for s in samples[-5:])
            state = ("" if util is None else
                     f"GPU {'busy' if util >= 50 else 'idle'} at {util:.0f}%, ")
            summary = (f"rank {rank}: {state}{how} (host at marker {cuda.host_marker} "
                       f"{cuda.host_label}, GPU done up to {cuda.gpu_marker} {cuda.gpu_label}); "
                       f"host {describe(window, rank)}")
            yield self.finding([rank], summary, {
                **rank_evidence(window, rank), "host_marker": cuda.host_marker,
                "host_label": cuda.host_label, "gpu_marker": cuda.gpu_marker,
                "gpu_label": cuda.gpu_label, "gpu_behind_seconds": round(behind, 1),
                "util_gpu": util, "host_waits_in_cuda_sync": how.startswith("the host")})


def _behind(window: Window, rank: int, cuda: CudaState) -> tuple[float, str]:
    """How long the GPU has been behind the host, and how that is known (0: it is not)."""
    if cuda.markers_behind > 0 and cuda.oldest_pending_at:
        behind = window.now - cuda.oldest_pending_at
        return behind, f"the GPU has not completed work queued {behind:.0f} s ago"
    work = window.work.get(rank)
    waited = stuck_for(window, rank)
    if work is None or work.stack_kind != CUDA_SYNC or waited is None:
        return 0.0, ""
    return waited, (f"the host has waited {waited:.0f} s in a CUDA synchronisation that does not "
                    "return: work queued after the last marker is not completing")
