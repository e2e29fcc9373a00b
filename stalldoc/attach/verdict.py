"""The one line ``stalldoc attach`` ends its look with: stalled, working, or ended."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from stalldoc.analysis.stacks import user_frame
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import RankWork
from stalldoc.rules.base import join_ranks

STALLED, WORKING, ENDED, UNOBSERVED = "stalled", "working", "ended", "unobserved"
_GRAVITY = (Severity.CRITICAL, Severity.ERROR, Severity.WARNING, Severity.INFO)


@dataclass(frozen=True)
class Look:
    """What one observation window showed."""

    outcome: str                         # STALLED, WORKING, ENDED or UNOBSERVED
    seconds: float                       # how long the ranks were observed
    ranks: tuple[int, ...]               # the ranks observed
    worked: Mapping[int, RankWork]       # ranks that showed work: their latest such verdict
    last: Mapping[int, RankWork] = field(default_factory=dict)   # each rank's last verdict


def where(stacks: RankStacks | None) -> str:
    """' in load_shard (job.py:12)' from a rank's stack, '' when unknown."""
    frame = user_frame(stacks.main) if stacks is not None and stacks.main else None
    return f" in {frame}" if frame else ""


def gravest(findings: Iterable[Finding]) -> Finding | None:
    ordered = sorted(findings, key=lambda f: _GRAVITY.index(f.severity))
    return ordered[0] if ordered else None


def verdict_line(look: Look, job: str, findings: Iterable[Finding],
                 stacks: Mapping[int, RankStacks]) -> str:
    """``job``: how the job is named ('pid 1234 (torchrun)')."""
    ranks = join_ranks(look.ranks)
    if look.outcome == STALLED:
        top = gravest(findings)
        return (f"stalled: no rank of {job} showed work in {look.seconds:.0f} s ({ranks} "
                f"observed)"
                + (f"; {top.code} {top.summary}" if top else ""))
    if look.outcome == ENDED:
        return f"ended: the ranks of {job} ended while attach observed them"
    if look.outcome == UNOBSERVED:
        return f"unknown: the ranks of {job} could not be observed (see stalldoc-errors.log)"
    said = [_rank_line(r, look.worked.get(r), look.last.get(r), stacks.get(r))
            for r in look.ranks]
    return (f"working: {job}, {ranks}, in the last {look.seconds:.0f} s: "
            + "; ".join(said))


def _rank_line(rank: int, worked: RankWork | None, last: RankWork | None,
               stacks: RankStacks | None) -> str:
    """'rank 1 CPU busy in compute (job.py:9)', 'rank 0 idle in main (job.py:21)'."""
    if last is not None and worked is not None and last.t == worked.t:
        return f"rank {rank} {worked.reason}{'' if ' in ' in worked.reason else where(stacks)}"
    text = f"rank {rank} idle{where(stacks)}"
    if worked is not None and last is not None:
        text += f" (showed work {last.t - worked.t:.0f} s before: {worked.reason})"
    return text
