"""SD541 ranks-out-of-step."""
from __future__ import annotations

import re
from typing import Any

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind
from stalldoc.rules.log_signature import LINE_START

_SUBSET = (r"\bsubmitted to be [\w, ]+ by (?:a )?subset of ranks and are waiting for "
           r"(?:the )?remainder of ranks for more than (?P<seconds>\d+) seconds")
_MISSING = r"\[(?P<which>missing|ready) ranks: (?P<ranks>\d+(?:, \d+)*)\]"
_HEADER = LINE_START + r"(?:Missing|Stalled) ranks:$"
_STALLED = LINE_START + r"(?P<ranks>\d+): \[[Hh]orovod\w*"
_RANK_LIST = re.compile(r"\d+")


class RanksOutOfStep(LogKind):
    """The job's own stall check says that some ranks submitted a collective the others did not.

    What it does
        Matches the warnings a framework prints when a collective has waited for part of the
        ranks too long: Horovod's stall inspector (``One or more tensors were submitted to be
        reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of
        ranks for more than 60 seconds``, with its ``Missing ranks:`` / ``Stalled ranks:``
        lists and the tensors' ``[missing ranks: 1, 3]``). PyTorch's ``Detected mismatch
        between collectives`` is SD529's.

    Why is this bad?
        Ranks that run different collectives, or some that never reach one (a rank that
        skipped a step, finished its data early, or raised), wait for each other forever:
        Horovod warns every minute and the job makes no progress. The warning names the ranks
        that did not submit, which are the ones to look at.

    Evidence
        the lines; ``seconds`` (how long the collective has waited), ``missing_ranks`` and
        ``stalled_ranks`` (the ranks the lines say have not submitted), ``ready_ranks`` (those
        an older Horovod lists as having submitted); the ranks that printed them.

    Fix
        Look at what the missing ranks do instead (their stacks, their last lines): every rank
        must run the same collectives in the same order, so give every rank the same number of
        batches (`drop_last`, an even split) and the same branches around allreduce.

    References
        horovod/horovod#2564 (TF 2.4 + Horovod 0.21 training stalls: the stall inspector reports
        tensors waiting for rank 1 (Missing ranks: 1: [...])); horovod/horovod#1012 (Example in
        docker hangs at the initial broadcast: rank 0 waits for rank 1 on every broadcast tensor
        ([1,0] is mpirun's --tag-output jobid,rank)); horovod/horovod#457 (128-node TACC run stalls
        after validation: the metric-averaging allreduce waits for several ranks);
        horovod/horovod#534 (tensorflow_mnist example stuck at the initial variable broadcast: rank
        0 never submits; later Horovod shuts down); horovod/horovod#134 (Old Horovod's single-line
        stall warning listing ready (not missing) ranks, with two GPUs per node (line cut where the
        excerpt ends)); horovod/horovod#1442 (BERT pretraining with Horovod hangs intermittently at
        step 83999: rank 0's stall inspector lists rank 6 as stalled); horovod/horovod#100 (Horovod
        in a Kubernetes pod with 2 ranks stuck forever: only rank 1 submitted the gradient
        allreduces (old 'ready ranks' format)).
    """

    code = "SD541"
    name = "ranks-out-of-step"
    kind = "stalled_ops"
    severity = Severity.ERROR
    headline = "ranks out of step in a collective"
    patterns = (_SUBSET, _MISSING, _HEADER, _STALLED)

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        found = super().details(match)
        which, ranks = found.pop("which", "stalled"), found.pop("ranks", None)
        if ranks is not None:
            found[f"{which.lower()}_ranks"] = [int(r) for r in _RANK_LIST.findall(ranks)]
        return found
