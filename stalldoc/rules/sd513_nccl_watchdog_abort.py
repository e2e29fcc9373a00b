"""SD513 nccl-watchdog-abort."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class NcclWatchdogAbort(LogSignature):
    """The NCCL watchdog found a failed or timed-out collective and takes the process down.

    What it does
        Matches ``failure detected by watchdog at work sequence id: N PG status: last enqueued
        work: N, last completed work: M``, ``Exception (either an error or timeout) detected by
        watchdog at work: N, last enqueued NCCL work: N, last completed NCCL work: M``, ``Some
        NCCL operations have failed or timed out``, ``To avoid data inconsistency, we are taking
        the entire process down`` and ``Process group watchdog thread terminated with
        exception``.

    Why is this bad?
        The process is aborted (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, the default); the job dies or,
        where the launcher keeps the other ranks, they hang in their next collective. The line
        does not say whether it was a timeout (SD501) or an NCCL error (SD516, SD517): look at
        the lines printed just before.

    Evidence
        the lines; ``seq``, ``last_enqueued``, ``last_completed`` (a rank whose last completed
        work is below the others' stopped there), ``pg``; the global ranks that printed them.

    Fix
        Find the cause in the finding printed with it: SD501 (a timeout: the rank outside the
        collective) or SD516 / SD517 (a network or NCCL error); the rank with the lowest
        ``last_completed`` stopped first. Keep TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (taking the process
        down beats hanging); with NCCL_DEBUG=WARN NCCL prints its reason too.

    References
        OpenRLHF/OpenRLHF#1126, pytorch/pytorch#152623 (failure detected ... last completed
        work far behind the last enqueued), hiyouga/LlamaFactory#6269,
        modelscope/DiffSynth-Studio#458 (some NCCL operations have failed ... taking the entire
        process down), huggingface/open-r1#620 (GRPO stuck: the watchdog thread terminated),
        snowflakedb/ArcticTraining#219.
    """

    code = "SD513"
    name = "nccl-watchdog-abort"
    severity = Severity.CRITICAL
    headline = "NCCL watchdog takes the process down"
    patterns = (
        r"failure detected by watchdog at work sequence id: (?P<seq>\d+) PG status: last enqueued "
        r"work: (?P<last_enqueued>-?\d+), last completed work: (?P<last_completed>-?\d+)",
        r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<seq>\d+), last "
        r"enqueued NCCL work: (?P<last_enqueued>-?\d+), last completed NCCL work: "
        r"(?P<last_completed>-?\d+)",
        r"Some NCCL operations have failed or timed out",
        r"To avoid data inconsistency, we are taking the entire process down",
        r"(?:Process group|NCCL) watchdog thread terminated with exception",
    )
    # the watchdog ended on a CUDA error: that error is the cause (SD540 says it)
    yields = (r"watchdog thread terminated with exception: (?:CUDA|HIP) error: ",)
