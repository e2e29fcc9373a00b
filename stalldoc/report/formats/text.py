"""``--format text``: the post-mortem for a terminal, tables aligned, stacks grouped."""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from stalldoc.analysis.phase_shares import SHARE_NAMES
from stalldoc.report.records import Report, RunInfo, RunRecord, node_title
from stalldoc.report.stack_groups import StackGroup, stack_groups
from stalldoc.report.text import read_summary, record_lines

STACK_FRAMES = 8   # frames shown per stack group, innermost first


def when(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}G"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]

    def line(values: Sequence[str], numeric: Sequence[bool]) -> str:
        parts = [v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    numeric = [all(_number(r[i]) for r in cells) and bool(cells) for i in range(len(headers))]
    return [line(list(headers), numeric)] + [line(r, numeric) for r in cells]


def _number(text: str) -> bool:
    return text.replace(".", "", 1).replace("-", "", 1).replace("%", "").replace("G", "")\
        .isdigit() or text == "-"


def ending(info: RunInfo) -> str:
    """How the run ended: the job's exit, who ended it, watch's own exit."""
    if info.attached is not None and info.ended_at is not None:
        return ("the job ended while attached (its exit status is not seen by attach)"
                if info.attached.get("job_ended") else "attach detached; the job ran on")
    if info.ended_at is None:
        return "still running (or its watcher was killed)"
    job = f"job exit {info.exit_code if info.exit_code is not None else 'unknown'}"
    if info.ended_by == "stalldoc":
        job += " (ended by stalldoc: --on-stall kill)"
    elif info.ended_by == "interrupt":
        job += " (ended by an interrupt to stalldoc watch)"
    if info.watch_exit_code is not None:
        job += f"; watch exit {info.watch_exit_code}"
    return job


class TextReporter:
    name: ClassVar[str] = "text"
    suffix: ClassVar[str] = ".txt"

    def render(self, report: Report) -> str:
        lines: list[str] = []
        for run in report.runs:
            lines += header(run, report.merged)
        groups = stack_groups(report)
        lines += stalls(report, groups) + findings(report) + stacks(report, groups)
        for run in report.runs:
            lines += telemetry(run, report.merged) + phases(run, report.merged)
            lines += step_shares(run, report.merged)
        return "\n".join(lines)


def header(run: RunRecord, merged: bool) -> list[str]:
    info = run.info
    title = f"stalldoc run {info.id} on {info.node}" + (f" ({node_title(run.node)})" if merged
                                                        and run.node != info.node else "")
    return [title,
            f"  command : {' '.join(info.command)}",
            f"  started : {when(info.started_at)}  ended: {when(info.ended_at)}",
            f"  end     : {ending(info)}",
            *attached(info), *requeued(info), *logs_read(info),
            f"  ranks   : {len({r.rank for r in run.ranks})}", *overhead(info), ""]


def requeued(info: RunInfo) -> list[str]:
    """The header line of a run that a requeue started in the run directory of earlier ones."""
    if not info.attempt:
        return []
    earlier = ", ".join(info.attempt.get("earlier", []))
    return [f"  attempt : {info.attempt.get('attempt')} (Slurm ran the job again; the runs "
            f"before it are in {earlier} in this directory)"]


def logs_read(info: RunInfo) -> list[str]:
    """The header lines of a run ``stalldoc logs`` read from saved logs: each file's lines."""
    if info.logs_read is None:
        return []
    return [f"  read    : {read_summary(item)}" for item in info.logs_read]


def attached(info: RunInfo) -> list[str]:
    """The header line of a run ``stalldoc attach`` observed (a job it did not start)."""
    seen = info.attached
    if seen is None:
        return []
    how = "followed" if seen.get("follow") else f"observed {seen.get('window_s', 0):.0f} s"
    return [f"  attached: to pid {','.join(str(p) for p in seen.get('pids', []))} (job started "
            f"{when(seen.get('job_started_at'))}, not by stalldoc); {how}"]


def _node(merged: bool, node: str) -> str:
    return f" on {node}" if merged else ""


def stalls(report: Report, groups: list[StackGroup]) -> list[str]:
    lines = ["Stalls:"]
    states = {(g.node, g.stall_id, r): g.state for g in groups for r in g.ranks}
    for s in report.stalls:
        lines.append(f"  #{s.id}{_node(report.merged, s.node)}: no rank showed work since "
                     f"{when(s.started_at)}, detected {when(s.detected_at)} (threshold "
                     f"{s.threshold:.0f} s), "
                     f"{f'ended {when(s.ended_at)}' if s.ended_at else 'never ended'}; ranks "
                     f"{','.join(map(str, s.ranks))}")
        rows = [(r, s.phases.get(str(r), "") or "-", *_seen(s.work.get(str(r), {})),
                 states.get((s.node, s.id, r), "not taken")) for r in s.ranks]
        if rows:
            lines += table(("rank", "phase", "cpu", "io", "gpu", "seen at detection",
                            "stack after"), rows, indent="     ")
    if not report.stalls:
        lines.append("  none")
    return lines + [""]


def _seen(work: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """CPU, I/O, GPU and the verdict at the stall's detection (from its stored work)."""
    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.0f}%"
    io = work.get("io_bps")
    return (pct(work.get("cpu_percent")), "-" if io is None else f"{io / 1e3:.0f} kB/s",
            pct(work.get("gpu_util")), work.get("reason", "-"))


def findings(report: Report) -> list[str]:
    lines = ["Findings:"]
    for f in report.findings:
        lines += record_lines({**asdict(f), "summary": f.summary + _node(report.merged, f.node)})
    if not report.findings:
        lines.append("  none")
    return lines


def stacks(report: Report, groups: list[StackGroup]) -> list[str]:
    """Each stall's ranks grouped by their main thread's frames, the waiting ones too."""
    lines: list[str] = []
    for g in groups:
        ranks = ",".join(map(str, g.ranks))
        where = f" in {g.frame}" if g.frame else ""
        lines += ["", f"Stack at stall #{g.stall_id}{_node(report.merged, g.node)}: "
                      f"rank{'s' if len(g.ranks) > 1 else ''} {ranks} ({g.state}){where}, "
                      f"by {g.method}"]
        lines += [f"      {frame}" for frame in g.frames[:STACK_FRAMES]]
        if len(g.frames) > STACK_FRAMES:
            lines.append(f"      ... {len(g.frames) - STACK_FRAMES} outer frame(s)")
    fallbacks = [s for s in report.stacks if s.error]
    if fallbacks:
        lines += ["", "Stacks not taken by py-spy:"]
        lines += [f"  stall #{s.stall_id} rank {s.rank}: {s.method}; {s.error}" for s in fallbacks]
    return lines


_COSTS = (   # a RunInfo count, and what it means for the user
    ("dropped_log_lines", "log     : {} line(s) not analysed (the sidecar lagged; the job's "
                          "output was complete)"),
    ("pruned_log_lines", "log     : {} line(s) between the first and the latest ones not kept "
                         "(log budget)"),
    ("pruned_stall_stacks", "stacks  : kept for the first and latest stalls; {} stall(s) in "
                            "between without them"),
    ("dropped_collectives", "store   : {} collective call(s) not kept (more than the store's "
                            "cap per rank and tick, or overwritten in a rank's ring before the "
                            "watcher read it)"),
    ("tick_errors", "watcher : {} tick(s) skipped on an internal error (stalldoc-errors.log)"))


def overhead(info: RunInfo) -> list[str]:
    """What stalldoc cost the job: the agent's start per Python process, lines not analysed."""
    lines = []
    startup = info.agent_startup
    if startup:
        lines.append(f"  agent   : start-up {startup['median_ms']} ms median, {startup['max_ms']} "
                     f"ms max over {startup['processes']} Python process(es)")
    lines += [f"  {text.format(n)}" for name, text in _COSTS if (n := getattr(info, name))]
    if info.journal_mode == "delete":
        lines.append("  store   : rollback journal (the run directory is on a network filesystem)")
    return lines


def _of(run: RunRecord, merged: bool) -> str:
    return f" ({run.node})" if merged else ""


def _percent(value: float | None) -> str:
    """A mean percentage, or "-" where it was not measured (no GPM, an older run)."""
    return "-" if value is None else f"{value}%"


def telemetry(run: RunRecord, merged: bool) -> list[str]:
    """GPUs, memory peaks, PCIe traffic by phase, the node, and probes off or failing."""
    lines: list[str] = []
    if run.gpus:
        lines += ["", f"GPUs{_of(run, merged)}:"] + table(
            ("gpu", "ranks", "peak used", "total", "util mean", "kernels mean", "max procs"),
            [(g.gpu, ",".join(map(str, g.ranks)) or "-", gib(g.peak_memory_used),
              gib(g.memory_total), f"{g.util_gpu_mean}%", _percent(g.util_compute_mean),
              g.max_processes) for g in run.gpus])
    if run.gpu_phases:
        lines += ["", f"PCIe by phase{_of(run, merged)}:"] + table(
            ("phase", "gpu-seconds", "host->gpu", "gpu->host", "util mean", "kernels mean"),
            [(p.phase or "-", p.gpu_seconds, gib(p.pcie_rx_bytes), gib(p.pcie_tx_bytes),
              f"{p.util_gpu_mean}%", _percent(p.util_compute_mean)) for p in run.gpu_phases])
    peaks = [w for w in run.watermarks if w.phase is None]
    if peaks:
        lines += ["", f"Memory peaks{_of(run, merged)}:"] + table(
            ("rank", "rss", "gpu (nvml)", "cuda allocated", "cuda reserved", "retries", "ooms"),
            [(w.rank, gib(w.peak_rss_bytes), gib(w.peak_gpu_memory_bytes),
              gib(w.peak_cuda_allocated_bytes), gib(w.peak_cuda_reserved_bytes),
              w.cuda_alloc_retries, w.cuda_ooms) for w in peaks])
    host = run.host
    if host.total_bytes:
        lines += ["", f"Node{_of(run, merged)}: lowest available memory "
                      f"{gib(host.min_available_bytes)} of {gib(host.total_bytes)}, peak swap "
                      f"in/out {gib(host.peak_swap_in_bps)}/s / {gib(host.peak_swap_out_bps)}/s,"
                      f" peak load {host.peak_load1 or 0:.1f} on {host.cores} cores"]
    return lines + probes(run, merged)


def probes(run: RunRecord, merged: bool) -> list[str]:
    troubled = [p for p in run.probes if not p.available or p.failures]
    skipping = [p for p in run.probes if p.skipped]
    if not troubled and not skipping:
        return []
    lines = ["", f"Probes off or failing{_of(run, merged)}:"]
    lines += [f"  {p.probe}: " + (p.unavailable or f"{p.failures} of {p.runs} runs failed, "
                                                   f"last: {p.last_error}") for p in troubled]
    return lines + [f"  {p.probe}: {p.skipped} bad sample(s) skipped" for p in skipping]


def phases(run: RunRecord, merged: bool) -> list[str]:
    if not run.phases:
        return []
    return ["", f"Phases{_of(run, merged)} (seconds):"] + table(
        ("name", "count", "median", "p95", "max"),
        [(n, p.count, p.median, p.p95, p.max) for n, p in run.phases.items()])


SHARE_COLUMNS = (*SHARE_NAMES.values(), "other")   # train, rollout, ..., waiting, other


def step_shares(run: RunRecord, merged: bool) -> list[str]:
    """Where each rank's cycles went: over the run and over its last cycles."""
    if not run.step_shares:
        return []
    return ["", f"Where the steps go{_of(run, merged)} (share of each cycle; the first cycle "
                "left out):"] + table(
        ("rank", "over", "cycles", "cycle s", *SHARE_COLUMNS),
        [(s.rank, s.over, f"{s.cycles} {s.cycle}", s.cycle_seconds,
          *(f"{s.shares.get(c, 0.0):.0%}" for c in SHARE_COLUMNS)) for s in run.step_shares])


REPORTER = TextReporter()
