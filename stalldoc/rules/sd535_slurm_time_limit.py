"""SD535 slurm-time-limit."""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.log_signature import LogSignature


class SlurmTimeLimit(LogSignature):
    """Slurm cancelled the job or its step because it reached its time limit.

    What it does
        Matches slurmstepd's ``*** STEP 4226796.2 ON eos0117 CANCELLED AT 2025-12-03T14:53:02
        DUE TO TIME LIMIT ***`` and ``*** JOB 494583 ON node CANCELLED AT ... DUE TO TIME LIMIT
        ***``, behind any prefix (``slurmstepd: error:``, ``slurmstepd-node: error:``, srun's
        ``--label`` task id, a timestamp), and the older wording that names the node last (``***
        JOB 830329 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME LIMIT on n447 ***``). srun's
        ``Job step aborted: Waiting up to 32 seconds for job step to finish`` and a cancel for
        another reason (``DUE TO PREEMPTION``, ``DUE TO JOB REQUEUE``, scancel's bare ``CANCELLED
        AT ...``) are not findings.

    Why is this bad?
        The job did not fail by itself: it ran out of the time it asked for (``--time``, or the
        partition's default), and Slurm sent SIGTERM then SIGKILL to every task. The ranks' exit
        codes and the launcher's tracebacks that follow are the kill's, not a cause. Whether the
        time ran out in useful training or in a stall is the question: a job that hung for hours
        before (a collective that never completed, an engine that never started) is cut here,
        as is one that finished its training but never exited (stalldoc's SD119).

    Evidence
        the lines; ``unit`` (JOB or STEP), ``job_id`` (``4226796.2`` for a step), ``node``,
        ``cancelled_at`` (Slurm's own clock).

    Fix
        The job did not fail, Slurm ended it at its time limit: first see whether it had stalled
        before (stalldoc's stall findings of this run, its last progress line). If it was still
        training, give it more ``--time``, or checkpoint and requeue (``#SBATCH
        --signal=USR1@120`` with Lightning's auto-requeue, ``--requeue``). If training had
        finished and the process did not exit, see SD119.

        To requeue, the job must save a checkpoint when the signal comes and resume from the
        latest one: Lightning's ``SLURMEnvironment(auto_requeue=True)`` does both on SIGUSR1
        (``requeue_signal`` to change it); under torchrun, which keeps such signals from the
        workers, send it to the batch script (``--signal=B:USR1@120``) and pass it on, or stop at
        a step budget the job knows fits. ``sacct -j JOBID -o JobID,State,Elapsed,Timelimit``
        shows ``TIMEOUT`` for such a job.

    References
        NVIDIA-NeMo/Megatron-Bridge#1656 (training done at 14:45, the step cut at the limit at
        14:53: a job that did not exit), NVIDIA-NeMo/Megatron-Bridge#3427 (a Nemotron 3 Super run
        that did not exit after its last iteration, ended eight minutes later by slurmstepd's
        ``[2026-04-20T03:25:23.011] error: *** STEP 1942963.1 ON``: a timestamp, no
        ``slurmstepd:``),
        Lightning-AI/pytorch-lightning#20542 (the step cut mid-epoch; the requeue did not
        follow), ZettaAI/zetta_utils#671 (JOB and STEP lines, after srun's ``Job step aborted``),
        ufs-community/ufs-weather-model#907 (behind srun's ``--label`` task id),
        DataBiosphere/toil#4706 (``slurmstepd-phoenix-07:``), desihub/desitarget#628 (the
        partition's default limit), marbl/canu#1067 (the older wording, node last);
        facebookincubator/submitit#1613 and facebookincubator/submitit#1708 (``CANCELLED ... DUE
        TO PREEMPTION`` / ``DUE TO JOB REQUEUE``: not this finding's words, though #1708's job
        had reached its time limit and submitit requeued it).
    """

    code = "SD535"
    name = "slurm-time-limit"
    severity = Severity.ERROR
    headline = "Slurm cancelled the job at its time limit"
    patterns = (
        r"\*\*\* (?P<unit>JOB|STEP) (?P<job_id>[\w.+]+) ON (?P<node>\S+) CANCELLED AT "
        r"(?P<cancelled_at>\S+) DUE TO TIME LIMIT \*\*\*",
        r"\*\*\* (?P<unit>JOB|STEP) (?P<job_id>[\w.+]+) CANCELLED AT (?P<cancelled_at>\S+) DUE "
        r"TO TIME LIMIT on (?P<node>\S+) \*\*\*",
    )

    def check(self, window: Window) -> Iterator[Finding]:
        for found in super().check(window):
            yield self.finding(found.ranks, _summary(found.evidence), found.evidence)


def _summary(evidence: Mapping[str, Any]) -> str:
    what = f"{evidence.get('unit', 'JOB')} {evidence.get('job_id', '?')}"
    where = f" on {evidence['node']}" if evidence.get("node") not in (None, "...") else ""
    when = f" at {evidence['cancelled_at']}" if "cancelled_at" in evidence else ""
    return (f"Slurm cancelled {what}{where}{when} due to its time limit: the job did not fail "
            "by itself, it ran out of time; whether it had stalled before is what to look at")
