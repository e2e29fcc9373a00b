"""SD102 collective-mismatch."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.causes import Cause
from stalldoc.analysis.rings import mismatches, wrapped_evidence
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, cause_of, join_ranks, rank_evidence

# causes that name the ranks on a path the others never took, and the fact that holds one of them
_BRANCH_RANK = {"some_ranks_only": "branch_rank", "forward_on_some_ranks": "forward_rank"}


class CollectiveMismatch(Rule):
    """Ranks called different collectives (op, size or dtype) at the same sequence number.

    What it does
        Compares, per process group, the collective each rank recorded under the same sequence
        number and reports the first one where the op, element count or dtype differ. The ranks
        named are those on the branch the cause names (see Evidence), else those outside a strict
        majority; with no majority (two ranks, or halves) every rank of the collective: which
        side is odd is not guessed.

    Why is this bad?
        Collectives are matched by order, not by name. When rank 0's call #7 is an all_reduce of
        1024 floats and rank 1's call #7 is a broadcast, the backend pairs them anyway: the job
        hangs, crashes with a size error, or silently corrupts tensors.

    Evidence
        group, seq, and each rank's (op, numel, dtype) for that call; frames of the odd ranks;
        ``wrapped_collectives``: per rank, the collectives of the group its agent's ring
        overwrote before the watcher read them (only when some were: an earlier mismatch may
        have been among them). ``cause``, where the ranks' Flight Recorder dumps decide one (see
        SD101): "some_ranks_only" (one side's collective was issued from a line the other rank
        never issued one from: a branch only some ranks take; ``branch_frames`` name it),
        "forward_on_some_ranks" (a forward under FSDP / ZeRO-3 on a path the other ranks never
        ran; the ranks named are those of ``forward_rank``'s call), "forward_count_differs",
        "size_mismatch" (one collective from one line, tensors of different sizes),
        "collective_order", "different_collectives", "uneven_steps" or "skipped_step"; the
        summary adds its
        sentence and the fix is the cause's own.

    Fix
        Make every rank issue the same sequence of collectives: find the code path that differs
        between ranks before that call (a branch on the rank, an uneven last batch, a parameter only
        some ranks own).

    References
        torch Flight Recorder COLLECTIVE_TYPE_MISMATCH / SIZE_OR_SYNTAX_MISMATCH / DTYPE_MISMATCH.
    """

    code = "SD102"
    name = "collective-mismatch"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        for mismatch in mismatches(window.agents):
            counts: dict[tuple[str, int, str], list[int]] = {}
            for rank, call in mismatch.calls.items():
                counts.setdefault(call, []).append(rank)
            calls = "; ".join(f"{join_ranks(rs)}: {op}({numel} x {dtype})"
                              for (op, numel, dtype), rs in counts.items())
            summary = (f"collective #{mismatch.seq} of group {mismatch.group} differs between "
                       f"ranks: {calls}")
            sides = sorted(counts.values(), key=len)
            cause = cause_of(window, sides[0], [r for side in sides[1:] for r in side])
            ranks = self._culprits(mismatch.calls, sides, cause)
            evidence = {**rank_evidence(window, ranks[0]),
                        "group": mismatch.group, "seq": mismatch.seq,
                        "calls": {str(r): {"op": c[0], "numel": c[1], "dtype": c[2]}
                                  for r, c in mismatch.calls.items()},
                        **wrapped_evidence(mismatch.wrapped)}
            yield self.caused(ranks, summary, evidence, cause)

    @staticmethod
    def _culprits(calls: dict[int, tuple[str, int, str]], sides: list[list[int]],
                  cause: Cause | None) -> list[int]:
        """The ranks on the branch the cause names; else the ranks outside a strict majority;
        else (a tie: two ranks, or halves) every rank, no side guessed."""
        branch_rank = _BRANCH_RANK.get(cause.kind, "") if cause is not None else ""
        if branch_rank:
            branch = calls[cause.facts[branch_rank]]
            return sorted(r for r, call in calls.items() if call == branch)
        if len(sides) > 1 and len(sides[-1]) > len(sides[-2]):
            return sorted(r for side in sides[:-1] for r in side)
        return sorted(calls)
