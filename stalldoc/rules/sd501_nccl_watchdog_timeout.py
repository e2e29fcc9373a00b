"""SD501 nccl-watchdog-timeout."""
from __future__ import annotations

from stalldoc.model import Severity
from stalldoc.rules.log_signature import LogSignature


class NcclWatchdogTimeout(LogSignature):
    """A collective timed out in PyTorch's NCCL watchdog (or the watchdog itself got stuck).

    What it does
        Matches ``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=N, OpType=X, ...)``
        and ``ProcessGroupNCCL's watchdog got stuck for N seconds`` in the job's output.

    Why is this bad?
        By the time the watchdog fires the job has been stuck for the whole NCCL timeout (10-30
        minutes, or never with swift's ~208-day default); the rank that prints it is usually a
        victim, waiting for a peer that is slow, stuck outside the collective, or dead.

    Evidence
        the lines, the sequence number and op type of the collective, the ranks that printed it.

    Fix
        Look for the rank that is *not* in collective SeqNum N: stalldoc's stall finding (SD101,
        SD103) names it with its frame. Fix that rank's cause first; raise the timeout only for
        collectives that are legitimately slow.

    References
        ms-swift issues #4306 (_ALLGATHER_BASE timeout while rank 0 waits on the rollout server),
        #3934; PyTorch ProcessGroupNCCL watchdog.
    """

    code = "SD501"
    name = "nccl-watchdog-timeout"
    severity = Severity.CRITICAL
    headline = "NCCL watchdog timeout"
    patterns = (
        r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)",
        r"ProcessGroupNCCL's watchdog got stuck for (?P<stuck_seconds>\d+) seconds",
    )
    fix = ("Find the rank that is not in that collective (stalldoc's stall finding names it with its "
           "frame) and fix its cause; raise the NCCL timeout only for collectives that are legitimately "
           "slow.")
