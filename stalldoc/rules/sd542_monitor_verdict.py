"""SD542 monitor-verdict."""
from __future__ import annotations

import re
from typing import Any

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind

_SGLANG = r"atchdog timeout \(self\.watchdog_timeout=(?P<timeout_seconds>[\d.]+)"
_HOROVOD = r"\bHorovod has been shut down\. This was caused by an exception on one of the ranks"
_BARRIER = (r"\bRank (?P<reporter>\d+) successfully reached monitoredBarrier, but received "
            r"errors while waiting for send/recv from rank (?P<faulty>\d+)")
_BARRIER_FAILED = r"\bRanks? (?P<faulty>[\d, ]+?) failed to pass monitoredBarrier in \d+ ms"
_ELASTIC = (r"\bWorker group FAILED\. (?P<attempts_left>\d+)/\d+ attempts left",
            r"\] Worker group failed$",
            r"\bRendezvousTimeoutError\b", r"\bRendezvousClosedError\b")
_COMPOSER = r"\bWaiting for local rank (?P<local_rank>\d+), bailing out: "
_SAID_BY = {"SGLang's scheduler watchdog": (_SGLANG,), "Horovod": (_HOROVOD,),
            "torch.distributed's monitoredBarrier": (_BARRIER, _BARRIER_FAILED),
            "torchelastic's agent": _ELASTIC, "Composer's local rank zero wait": (_COMPOSER,)}
_RANKS = re.compile(r"\d+")
_FIXES = {
    "SGLang's scheduler watchdog": "SGLang's scheduler made no progress for its watchdog's "
                                   "time: a forward pass stuck in a collective (its TP or DP "
                                   "peers) or a kernel; `py-spy dump` of the scheduler "
                                   "processes says which, and `--watchdog-timeout` bounds it.",
    "torch.distributed's monitoredBarrier": "The barrier names the rank that never arrived: "
                                            "look at that rank's stack and last lines, not at "
                                            "the ranks that waited for it.",
    "torchelastic's agent": "The agent saw a worker fail (or the rendezvous time out) and "
                            "restarts or ends the group: the first failed worker's own error, "
                            "above in its log, is the cause; a rendezvous that times out is a "
                            "node that did not join (`--rdzv-endpoint`, the network, its start).",
}


class MonitorVerdict(LogKind):
    """A watchdog, monitor or launcher of the job's own stack gave its verdict on a rank.

    What it does
        Matches the verdicts of monitors that have no rule of their own: SGLang's scheduler
        watchdog (``Watchdog timeout (self.watchdog_timeout=300)``), Horovod's ``Horovod has
        been shut down. This was caused by an exception on one of the ranks``, gloo's
        monitoredBarrier (``Rank 1 successfully reached monitoredBarrier, but received errors
        while waiting for send/recv from rank 0``), torchelastic's agent (``Worker group FAILED.
        3/3 attempts left``, ``RendezvousTimeoutError``) and Composer's ``Waiting for local rank
        0, bailing out``. The NCCL watchdog's verdicts are SD501, SD511 and SD513; NVRx's,
        HCCL's and ROCm's are SD537.

    Why is this bad?
        The monitor acts on its verdict: it ends the process, the group or the job, or restarts
        it. Its line comes minutes after the cause, and it names the rank that gave up waiting
        more often than the rank that stopped; monitoredBarrier and the NCCL watchdog's lines are
        the exceptions that name the rank that did not come.

    Evidence
        the lines; ``what`` (which monitor spoke), ``faulty_ranks`` (ranks a monitoredBarrier
        names as not arrived), ``timeout_seconds``, ``attempts_left``, ``local_rank``; the ranks
        that printed them.

    Fix
        Find what the monitor saw stop, not the monitor: the first error of the run, or the
        stack of the rank it names (stalldoc's stall findings name it with its frame). Raise the
        monitor's timeout only for a phase that is legitimately longer.

    References
        horovod/horovod#410 (Distributed Horovod run stops after mpirun reports a process returned
        non-zero; every op then fails with Horovod's shutdown verdict);
        NVIDIA/DeepLearningExamples#972 (NCF training with Horovod fails: Horovod shut down after a
        rank's exception); horovod/horovod#3412 (TF2 Keras training with Horovod: the allreduce of
        grads fails because Horovod was shut down; mpirun then aborts the job);
        UCSB-AI/Soft-Thinking#10 (The SGLang-based Soft-Thinking baseline script hangs; the
        scheduler's watchdog fires after 300 s and the server is killed by sigquit);
        QwenAudio/CosyVoice#1727 (CosyVoice2 flow training: at the end of an epoch the gloo
        monitoredBarrier on rank 1 times out waiting for rank 0 (30 min send timeout) and names
        rank 0 as the faulty rank); mosaicml/examples#292 (composer -n 8 runs hang in
        dist.init_process_group and composer's launcher gives up waiting for local rank 0 after 60
        s (quoted inline in the comment)); kubeflow/trainer#1638 (Elastic PyTorchJob on the etcd
        backend: deleting one pod makes the torchelastic agents on both pods fail with
        RendezvousClosedError; pods restart and fail again (line inside the error_handler JSON));
        facebookresearch/av_hubert#19 (Multi-node fairseq-hydra-train under torch.distributed.run:
        the elastic agent's rendezvous times out (line inside the error_handler JSON));
        shun-zheng/Doc2EDAG#24 (4-GPU training under torch.distributed.run: the elastic agent
        declares the worker group failed and restarts it (restart_count=1));
        open-mmlab/mmdetection#6779 (After a store-based-barrier timeout on rank 1 the local
        elastic agent marks the worker group failed).
    """

    code = "SD542"
    name = "monitor-verdict"
    kind = "monitor_verdict"
    severity = Severity.ERROR
    headline = "a monitor gave its verdict"
    wordings = _SAID_BY
    fixes = _FIXES

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        found = super().details(match)
        if (reporter := found.pop("reporter", None)) is not None:
            found.setdefault("rank", int(reporter))
        if (faulty := found.pop("faulty", None)) is not None:
            found["faulty_ranks"] = [int(r) for r in _RANKS.findall(faulty)]
        return found
