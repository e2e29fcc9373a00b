"""SD102 collective-mismatch."""
from __future__ import annotations

from typing import Iterator

from stalldoc.analysis.rings import mismatches, wrapped_evidence
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, join_ranks, rank_evidence


class CollectiveMismatch(Rule):
    """Ranks called different collectives (op, size or dtype) at the same sequence number.

    What it does
        Compares, per process group, the collective each rank recorded under the same sequence
        number and reports the first one where the op, element count or dtype differ.

    Why is this bad?
        Collectives are matched by order, not by name. When rank 0's call #7 is an all_reduce of
        1024 floats and rank 1's call #7 is a broadcast, the backend pairs them anyway: the job
        hangs, crashes with a size error, or silently corrupts tensors.

    Evidence
        group, seq, and each rank's (op, numel, dtype) for that call; frames of the odd ranks;
        ``wrapped_collectives``: per rank, the collectives of the group its agent's ring
        overwrote before the watcher read them (only when some were: an earlier mismatch may
        have been among them).

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
            majority = max(counts.values(), key=len)
            odd = sorted(r for r in mismatch.calls if r not in majority)
            calls = "; ".join(f"{join_ranks(rs)}: {op}({numel} x {dtype})"
                              for (op, numel, dtype), rs in counts.items())
            summary = (f"collective #{mismatch.seq} of group {mismatch.group} differs between "
                       f"ranks: {calls}")
            yield self.finding(odd or sorted(mismatch.calls), summary, {
                **rank_evidence(window, (odd or sorted(mismatch.calls))[0]),
                "group": mismatch.group, "seq": mismatch.seq,
                "calls": {str(r): {"op": c[0], "numel": c[1], "dtype": c[2]}
                          for r, c in mismatch.calls.items()},
                **wrapped_evidence(mismatch.wrapped)})
