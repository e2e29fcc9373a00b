"""The terminal rendering of a report document, and of findings as the watcher prints them."""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from stalldoc.findings.record import finding_fields
from stalldoc.model import Finding


def _when(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def record_lines(record: Mapping[str, Any]) -> list[str]:
    """A finding's lines, from its record (``stalldoc.findings.record``): what the watcher
    prints, ``check`` prints and the report shows."""
    frames = list(record["evidence"].get("frames", []))
    lines = [f"  [{record['code']} {record['severity']}] {record['summary']}"]
    lines += [f"      {frame}" for frame in frames[:8]]
    lines.append(f"      fix: {record['fix']}")
    return lines


def finding_lines(code: str, severity: str, summary: str, frames: list[str], fix: str) -> list[str]:
    """``record_lines`` of a record given field by field (the report's older caller)."""
    return record_lines({"code": code, "severity": severity, "summary": summary,
                         "evidence": {"frames": frames}, "fix": fix})


def render_findings(findings: Iterable[Finding]) -> str:
    """What the watcher prints when it has a diagnosis."""
    return "\n".join(line for f in findings for line in record_lines(finding_fields(f)))


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}G"


def telemetry_lines(doc: dict[str, Any]) -> list[str]:
    """GPUs, memory peaks, PCIe traffic by phase, the node, and probes that were off or failed."""
    lines: list[str] = []
    if doc.get("gpus"):
        lines += ["", "GPUs: gpu ranks peak-used/total util-mean max-procs"]
        lines += [f"  {g['gpu']} {g['ranks']} {_gib(g['peak_memory_used'])}/"
                  f"{_gib(g['memory_total'])} {g['util_gpu_mean']}% {g['max_processes']}"
                  for g in doc["gpus"]]
    if doc.get("gpu_phases"):
        lines += ["", "PCIe by phase: phase gpu-seconds host->gpu gpu->host util-mean"]
        lines += [f"  {p['phase'] or '-'} {p['gpu_seconds']} {_gib(p['pcie_rx_bytes'])} "
                  f"{_gib(p['pcie_tx_bytes'])} {p['util_gpu_mean']}%" for p in doc["gpu_phases"]]
    peaks = doc.get("watermarks", {}).get("run", [])
    if peaks:
        lines += ["", "Memory peaks: rank rss gpu(nvml) cuda-allocated cuda-reserved retries ooms"]
        lines += [f"  {w['rank']} {_gib(w['peak_rss_bytes'])} {_gib(w['peak_gpu_memory_bytes'])} "
                  f"{_gib(w['peak_cuda_allocated_bytes'])} {_gib(w['peak_cuda_reserved_bytes'])} "
                  f"{w['cuda_alloc_retries'] if w['cuda_alloc_retries'] is not None else '-'} "
                  f"{w['cuda_ooms'] if w['cuda_ooms'] is not None else '-'}" for w in peaks]
    host = doc.get("host") or {}
    if host.get("total_bytes"):
        lines += ["", f"Node: lowest available memory {_gib(host['min_available_bytes'])} of "
                      f"{_gib(host['total_bytes'])}, peak swap in/out "
                      f"{_gib(host['peak_swap_in_bps'])}/s / {_gib(host['peak_swap_out_bps'])}/s, "
                      f"peak load {host['peak_load1']:.1f} on {host['cores']} cores"]
    troubled = [p for p in doc.get("probes", []) if not p["available"] or p["failures"]]
    if troubled or any(p.get("skipped") for p in doc.get("probes", [])):
        lines += ["", "Probes off or failing:"]
        lines += [f"  {p['probe']}: " + (p["unavailable"] or
                                         f"{p['failures']} of {p['runs']} runs failed, last: "
                                         f"{p['last_error']}") for p in troubled]
    skipping = [p for p in doc.get("probes", []) if p.get("skipped")]
    lines += [f"  {p['probe']}: {p['skipped']} bad sample(s) skipped" for p in skipping]
    return lines


def _overhead(run: dict[str, Any]) -> list[str]:
    """What stalldoc cost the job: the agent's start per Python process, lines not analysed."""
    lines = []
    startup = run.get("agent_startup")
    if startup:
        lines.append(f"  agent   : start-up {startup['median_ms']} ms median, {startup['max_ms']} "
                     f"ms max over {startup['processes']} Python process(es)")
    if run.get("dropped_log_lines"):
        lines.append(f"  log     : {run['dropped_log_lines']} line(s) not analysed (the sidecar "
                     f"lagged; the job's output was complete)")
    if run.get("pruned_log_lines"):
        lines.append(f"  log     : {run['pruned_log_lines']} line(s) between the first and the "
                     f"latest ones not kept (log budget)")
    if run.get("pruned_stall_stacks"):
        lines.append(f"  stacks  : kept for the first and latest stalls; "
                     f"{run['pruned_stall_stacks']} stall(s) in between without them")
    if run.get("tick_errors"):
        lines.append(f"  watcher : {run['tick_errors']} tick(s) skipped on an internal error "
                     f"(stalldoc-errors.log)")
    if run.get("journal_mode") == "delete":
        lines.append("  store   : rollback journal (the run directory is on a network filesystem)")
    return lines


def render_report(doc: dict[str, Any]) -> str:
    run = doc["run"]
    lines = [f"stalldoc run {run.get('id')} on {run.get('node')}",
             f"  command : {' '.join(run.get('command', []))}",
             f"  started : {_when(run.get('started_at'))}  ended: {_when(run.get('ended_at'))}"
             f"  exit: {run.get('exit_code')}",
             f"  ranks   : {len({r['rank'] for r in doc['ranks']})}", *_overhead(run), "",
             "Stalls:"]
    for s in doc["stalls"] or []:
        lines.append(f"  #{s['id']} no rank showed work since {_when(s['started_at'])}, detected "
                     f"{_when(s['detected_at'])} (threshold {s['threshold']:.0f} s), ended "
                     f"{_when(s['ended_at'])}; ranks {s['ranks']}")
        phases = ", ".join(f"rank {r} {p}" for r, p in s.get("phases", {}).items() if p)
        if phases:
            lines.append(f"     in phases: {phases}")
        lines += [f"     rank {r}: {w['seen']} ({w['reason']})"
                  for r, w in s.get("work", {}).items()]
    if not doc["stalls"]:
        lines.append("  none")
    lines += ["", "Findings:"]
    for f in doc["findings"]:
        lines += finding_lines(f["code"], f["severity"], f["summary"],
                               f["evidence"].get("frames", []), f["fix"])
    if not doc["findings"]:
        lines.append("  none")
    lines += telemetry_lines(doc)
    fallbacks = [s for s in doc["stacks"] if s.get("error")]
    if fallbacks:
        lines += ["", "Stacks not taken by py-spy:"]
        lines += [f"  stall #{s['stall_id']} rank {s['rank']}: {s['method']}; {s['error']}"
                  for s in fallbacks]
    if doc["phases"]:
        lines += ["", "Phases (seconds): name count median p95 max"]
        lines += [f"  {n} {p['count']} {p['median']} {p['p95']} {p['max']}"
                  for n, p in doc["phases"].items()]
    return "\n".join(lines)
