"""SD302 cpu-oversubscription."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import HostMemory
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MIN_SAMPLES, recent

OVERLOAD = 2.0      # load per core
JOB_SHARE = 0.9     # of all cores, used by the job's ranks themselves


def _load(node: HostMemory) -> float:
    """Runnable threads now where the kernel says it; else the 1-minute load average (which
    lags a minute behind: a neighbour's load that just ended still counts in it)."""
    return float(node.running) if node.running is not None else node.load1


class CpuOversubscription(Rule):
    """More runnable threads than the node has cores, for a sustained time.

    What it does
        Every tick, over the last 30 s: flags more runnable threads than 2 x the cores in every
        sample (``procs_running``; the 1-minute load average where that is not readable) while the job's own ranks use at least 90 % of all cores (so a busy
        neighbour alone does not count), with the ranks' thread counts.

    Why is this bad?
        Each rank starts its own OpenMP / MKL pool (one thread per core by default), dataloader
        workers and, in GRPO, vLLM engines (num_infer_workers x tensor_parallel_size); together
        they fight for the cores, collectives wait on the slowest rank and the step time
        explodes — a slow-motion stall.

    Evidence
        load average, cores, threads per rank.

    Fix
        Set OMP_NUM_THREADS to cores / ranks per node, lower dataloader_num_workers, and keep
        num_infer_workers x tensor_parallel_size within the node's GPUs and cores.

    References
        ms-swift issue #3695 (num_infer_workers 8 + tensor_parallel_size 8 hang); PyTorch CPU
        threading docs.
    """

    code = "SD302"
    name = "cpu-oversubscription"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        nodes = recent(window.node, window.now)
        if len(nodes) < MIN_SAMPLES or any(_load(n) < OVERLOAD * n.cores for n in nodes):
            return
        last = nodes[-1]
        used = sum(h[-1].cpu_percent or 0.0 for h in window.host.values() if h)
        if used < JOB_SHARE * 100.0 * last.cores:
            return
        threads = {str(r): h[-1].threads for r, h in sorted(window.host.items()) if h}
        yield self.finding(sorted(window.host), (
            f"CPU oversubscribed: load {_load(last):.1f} on {last.cores} cores for "
            f"{nodes[-1].t - nodes[0].t:.0f} s; threads per rank {threads}"),
            {"load1": last.load1, "running": last.running, "cores": last.cores,
             "threads": threads,
             "job_cpu_percent": used})
