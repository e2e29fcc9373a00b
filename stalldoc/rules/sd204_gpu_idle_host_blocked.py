"""SD204 gpu-idle-host-blocked."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, describe, join_ranks, rank_evidence
from stalldoc.rules.telemetry import gpus_of, mean

IDLE_PERCENT = 5.0


class GpuIdleHostBlocked(Rule):
    """At a stall, the GPUs have finished everything they were given: the hang is on the host.

    What it does
        At a stall, per rank with CUDA sync markers and NVML: the GPU completed every marker the
        host recorded and is idle (under 5 % over the last samples). The stall is then in
        Python — the host frame is where to look — not in a kernel or an NCCL collective.

    Why is this bad?
        Without this split, a silent GRPO job with GPU memory held and utilisation at zero
        invites guesses about NCCL; the device is in fact waiting for the host (a reward call, a
        rollout queue, a lock, a data loader).

    Evidence
        the ranks, their GPU utilisation, the last marker the GPU completed, each host's frame
        and phase.

    Fix
        Follow the host frame of the named ranks (and the rank-level findings SD101, SD104, SD107):
        the blocking call on the host is the cause; the GPUs are only waiting for it.

    References
        DLRover's xpu-timer and SageMaker HyperPod (a hang read from flat GPU utilisation); modelscope/ms-swift#6962 (util 0, memory flat).
    """

    code = "SD204"
    name = "gpu-idle-host-blocked"
    severity = Severity.INFO

    def check(self, window: Window) -> Iterator[Finding]:
        idle: dict[int, float] = {}
        for rank in sorted(window.agents):
            cuda = window.agents[rank].cuda
            util = mean(s.util_gpu for samples in gpus_of(window, rank).values()
                        for s in samples[-5:])
            if cuda is not None and cuda.markers_behind == 0 and util is not None \
                    and util < IDLE_PERCENT:
                idle[rank] = util
        if not idle:
            return
        ranks = sorted(idle)
        first = ranks[0]
        yield self.finding(ranks, f"GPUs of {join_ranks(ranks)} idle with all queued work done: "
                                  f"the stall is on the host; rank {first} {describe(window, first)}",
                           {**rank_evidence(window, first),
                            "util_gpu": {str(r): u for r, u in idle.items()},
                            "gpu_done": {str(r): window.agents[r].cuda.gpu_label  # type: ignore
                                         for r in ranks}})
