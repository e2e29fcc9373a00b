"""SD512 nccl-desync-report."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class NcclDesyncReport(LogSignature):
    """PyTorch's desync report names the ranks that never reached a collective.

    What it does
        Matches the report TORCH_NCCL_DESYNC_DEBUG=1 adds to a collective timeout:
        ``[R] Timeout at collective: OP, #N``, ``To our best knowledge, the lagging/dead/mismatched
        ranks that caused the desync are:``, ``[7] finished collective #182, but didn't join
        collective #183``, ``[1, 2] joined but didn't finish collective #N`` and ``ranks [..] are
        the lagging ranks that caused this timeout. They never joined any collectives``.

    Why is this bad?
        It is the answer to "who is missing": the ranks it lists stopped issuing collectives
        (stuck, dead, or on another code path) or issued a different one; the others wait for
        them until the timeout.

    Evidence
        the lines; ``lagging_ranks`` (ranks *of the group that timed out*: the global ranks for
        the default group), ``seq`` / ``next_seq`` and ``op``; the global ranks that printed
        them.

    Fix
        Look at what the lagging ranks were doing at collective #N (stalldoc's stall finding and
        their stacks): a rank that took another branch (an ``if rank == 0`` around a collective), an
        uneven last batch, a rank still in rollout. Make every rank call the same collectives in the
        same order.

    References
        pytorch/pytorch#152623 (a lagging rank that finished #182 and never joined #183),
        pytorch/pytorch#68310 (the report's design).
    """

    code = "SD512"
    name = "nccl-desync-report"
    severity = Severity.ERROR
    headline = "NCCL desync report"
    patterns = (
        r"\[(?P<lagging_ranks>\d+(?:, \d+)*)\] finished collective #(?P<seq>\d+), but didn't join "
        r"collective #(?P<next_seq>\d+)",
        r"\[(?P<lagging_ranks>\d+(?:, \d+)*)\] joined but didn't finish collective #(?P<seq>\d+)",
        r"ranks \[(?P<lagging_ranks>\d+(?:, \d+)*)\] are the lagging ranks that caused this timeout",
        r"the lagging/dead/mismatched ranks that caused the desync are",
        r"\[(?P<reporting_rank>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)",
    )
