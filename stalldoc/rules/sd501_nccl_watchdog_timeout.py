"""SD501 nccl-watchdog-timeout."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from stalldoc.analysis.watchdog import align
from stalldoc.model import Finding, Severity, Window
from stalldoc.rules.base import describe, join_ranks, rank_evidence
from stalldoc.rules.log_signature import _RANK, LogSignature


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

    def check(self, window: Window) -> Iterator[Finding]:
        for finding in super().check(window):
            yield with_rings(window, finding)


def with_rings(window: Window, finding: Finding) -> Finding:
    """The finding with what the agents' rings say about the collective that timed out: the
    printing rank's pending entry, who waits with it, who never entered it and where they are."""
    evidence = finding.evidence
    match = _RANK.search(evidence["lines"][0]) if evidence.get("lines") else None
    if match is None or "seq" not in evidence:
        return finding
    rank, printed_at = int(match.group(1)), float(evidence.get("first_at", window.now))
    live = {r.rank for r in window.ranks} - {e.rank for e in window.exits if e.t < printed_at}
    found = align(rank, evidence.get("op"), evidence.get("pg"), window.agents, live | {rank})
    if found is None:
        return finding
    pending = found.pending
    ring = {"group": found.group, "seq": pending.seq, "op": pending.op,
            "op_agrees": found.op_agrees, "waiting_ranks": list(found.waiting),
            "missing_ranks": list(found.missing), "passed_ranks": list(found.passed),
            "culprits": {str(r): rank_evidence(window, r) for r in found.missing}}
    said = (f"rank {rank}'s watchdog: {evidence.get('op', '?')} SeqNum {evidence['seq']} timed "
            f"out; rank {rank} waits in {pending.op} #{pending.seq} (group {found.group})")
    if found.missing:
        said += (f"; the ring shows {join_ranks(found.missing)} never entered #{pending.seq}; "
                 + ", ".join(f"rank {r} is {describe(window, r)}" for r in found.missing))
    elif found.passed:
        said += f"; {join_ranks(found.passed)} completed #{pending.seq} (ranks disagree)"
    return dataclasses.replace(finding, summary=said, evidence={**evidence, "ring": ring})
