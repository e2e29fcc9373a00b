"""``--format perfetto``: the run as a Chrome Trace Event JSON timeline, for ui.perfetto.dev,
chrome://tracing or Chrome DevTools' Performance panel.

- One process per rank (pid = rank + 1, sorted by rank; "node1 rank 11" when several nodes are
  merged): its ended phases ("phases" lanes) and the phase sampled at each tick ("phase
  (sampled)"), its collective calls per process group ("collectives world": a pending one lasts
  to the rank's end), the stalls it took part in, its exit ("exit 143 (SIGTERM)"), counters of
  its memory (RSS, CUDA allocated / reserved, GPU memory) and CPU.
- One process per node ("node vm"), after the ranks: stall spans, findings, stalldoc ending the
  job (--on-stall kill), available memory and load, and per GPU its memory, PCIe tx / rx and
  utilisation.
- Flow arrows link collective #N of a group across ranks, in the order the ranks entered it;
  ranks that read one value of the wall clock on entering start a nanosecond apart (DevTools
  keys a flow's slices by their start).
- Times are microseconds since the report's earliest start (every node's wall clock);
  ``otherData`` says which run, the (redacted) command and the stalldoc version.
"""
from __future__ import annotations

import dataclasses
import json
import signal
from collections import defaultdict
from typing import Any, ClassVar, Iterable

from stalldoc import __version__
from stalldoc.redact import redact_argv, redact_text
from stalldoc.report.formats.trace_events import (Event, Slice, complete, counter, flow, instant,
                                                  lanes, metadata)
from stalldoc.report.records import CollectiveSpan, RankRecord, Report, RunRecord, node_title

NODE_PID = 1_000_000          # node processes: after every rank
MIB = 2**20
Link = tuple[int, int, Slice]   # pid, tid, slice: one end of a flow


def rank_pid(rank: int) -> int:
    return rank + 1


class Trace:
    """The events being written, with the processes and named threads they use."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.meta: list[Event] = []
        self.events: list[Event] = []
        self.tids: dict[tuple[int, str], int] = {}
        self.processes: set[int] = set()
        self.left_out = 0

    def us(self, t: float) -> float:
        """Wall-clock seconds to microseconds since the start."""
        return round((t - self.t0) * 1e6, 3)

    def process(self, pid: int, name: str, sort_index: int) -> None:
        if pid not in self.processes:
            self.processes.add(pid)
            self.meta += [metadata(pid, 0, "process_name", name),
                          metadata(pid, 0, "process_sort_index", sort_index)]

    def thread(self, pid: int, name: str) -> int:
        """The thread ``name`` of process ``pid`` (numbered in order of first use)."""
        key = (pid, name)
        if key not in self.tids:
            tid = self.tids[key] = 1 + sum(1 for p, _ in self.tids if p == pid)
            self.meta += [metadata(pid, tid, "thread_name", name),
                          metadata(pid, tid, "thread_sort_index", tid)]
        return self.tids[key]

    def add(self, *events: Event | None) -> None:
        self.events += [e for e in events if e is not None]

    def span(self, t0: float, t1: float | None) -> tuple[float, float]:
        ts = self.us(t0)
        return ts, max(0.0, self.us(t1 if t1 is not None else t0) - ts)

    def slices(self, pid: int, name: str, slices: Iterable[Slice]) -> list[Link]:
        """Slices on lanes of thread ``name`` ("name", "name #2"...); where each went."""
        packed, left_out = lanes(slices)
        self.left_out += left_out
        placed = []
        for i, lane in enumerate(packed):
            tid = self.thread(pid, name if i == 0 else f"{name} #{i + 1}")
            for s in lane:
                self.add(complete(pid, tid, s))
                placed.append((pid, tid, s))
        return placed


def rank_label(run: RunRecord, rank: int, merged: bool) -> str:
    return f"{run.node} rank {rank}" if merged else f"rank {rank}"


def run_end(run: RunRecord) -> float:
    """When the run's records end: its end, else its latest sample, else its start."""
    times = [run.info.ended_at, *(p.t for p in run.timeseries.ranks),
             *(r.ended_at for r in run.ranks)]
    known = [t for t in times if t is not None]
    return max(known) if known else run.info.started_at or 0.0


def rank_ends(run: RunRecord) -> dict[int, float]:
    """Each rank's last exit (a rank still running: the run's end)."""
    end = run_end(run)
    ends: dict[int, float] = {}
    for r in run.ranks:
        ends[r.rank] = max(ends.get(r.rank, 0.0), r.ended_at if r.ended_at is not None else end)
    return ends


def rank_processes(trace: Trace, run: RunRecord, merged: bool) -> list[int]:
    ranks = sorted({r.rank for r in run.ranks} | {s.rank for s in run.spans}
                   | {c.rank for c in run.collectives} | {p.rank for p in run.timeseries.ranks})
    for rank in ranks:
        trace.process(rank_pid(rank), rank_label(run, rank, merged), rank)
    return ranks


def phases(trace: Trace, run: RunRecord) -> None:
    by_rank: dict[int, list[Slice]] = defaultdict(list)
    for p in run.spans:
        by_rank[p.rank].append(Slice(*trace.span(p.started_at, p.ended_at), p.name, "phase"))
    for rank, slices in by_rank.items():
        trace.slices(rank_pid(rank), "phases", slices)


def sampled_phases(trace: Trace, run: RunRecord) -> None:
    """The phase each rank was in at each tick, as slices from one change to the next."""
    points: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for p in run.timeseries.ranks:
        points[p.rank].append((p.t, p.phase or ""))
    for rank, seen in points.items():
        seen.sort()
        slices, start = [], 0
        for i in range(1, len(seen) + 1):
            if i == len(seen) or seen[i][1] != seen[start][1]:
                t1 = seen[min(i, len(seen) - 1)][0]
                if seen[start][1]:
                    slices.append(Slice(*trace.span(seen[start][0], t1), seen[start][1],
                                        "phase (sampled)"))
                start = i
        trace.slices(rank_pid(rank), "phase (sampled)", slices)


def collective_slice(trace: Trace, c: CollectiveSpan, end: float) -> Slice:
    pending = c.completed_at is None
    args = {"group": c.group, "seq": c.seq, "op": c.op, "numel": c.numel, "dtype": c.dtype,
            "pending": pending}
    name = f"{c.op} #{c.seq}" + (" (pending)" if pending else "")
    return Slice(*trace.span(c.entered_at, max(end, c.entered_at) if pending else c.completed_at),
                 name, "collective", args)


def collectives(trace: Trace, run: RunRecord) -> list[Link]:
    ends, last = rank_ends(run), run_end(run)
    by_lane: dict[tuple[int, str], list[Slice]] = defaultdict(list)
    starts: dict[tuple[str, int], set[float]] = defaultdict(set)
    for c in sorted(run.collectives, key=lambda c: (c.group, c.seq, c.entered_at, c.rank)):
        s = own_start(collective_slice(trace, c, ends.get(c.rank, last)), starts[(c.group, c.seq)])
        by_lane[(c.rank, c.group)].append(s)
    placed: list[Link] = []
    for (rank, group), slices in sorted(by_lane.items()):
        placed += trace.slices(rank_pid(rank), f"collectives {group}", slices)
    return placed


def own_start(s: Slice, taken: set[float]) -> Slice:
    """``s`` moved on by a nanosecond while another rank's slice of the same call starts at the
    same microsecond figure (two ranks woken by one scheduler tick read one value of the wall
    clock, whose float steps by about 0.24 us): DevTools keys the slices of a flow by their
    start, and would drop all but one of them, and with them the arrow."""
    ts = s.ts
    while ts in taken:
        ts = round(ts + 0.001, 3)
    taken.add(ts)
    return s if ts == s.ts else dataclasses.replace(s, ts=ts, dur=max(0.0, s.dur - (ts - s.ts)))


def flows(trace: Trace, placed: list[Link]) -> None:
    """Collective #N of a group across ranks, linked in the order the ranks entered it."""
    calls: dict[tuple[str, int], dict[int, Link]] = defaultdict(dict)
    for link in placed:
        args = link[2].args
        calls[(args["group"], args["seq"])][link[0]] = link
    for n, ((group, seq), by_pid) in enumerate(sorted(calls.items()), start=1):
        if len(by_pid) > 1:
            chain = sorted(by_pid.values(), key=lambda link: (link[2].ts, link[0]))
            trace.add(*flow(chain, n, f"{chain[0][2].args['op']} #{seq} ({group})"))


def rank_counters(trace: Trace, run: RunRecord) -> None:
    for p in run.timeseries.ranks:
        pid, ts = rank_pid(p.rank), trace.us(p.t)
        trace.add(counter(pid, ts, "memory (MiB)", {
            "rss": mib(p.rss_bytes), "cuda_allocated": mib(p.cuda_allocated),
            "cuda_reserved": mib(p.cuda_reserved), "gpu_memory": mib(p.gpu_memory_bytes)}),
            counter(pid, ts, "CPU (%)", {"cpu": p.cpu_percent}))


def mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 3)


def exit_name(r: RankRecord) -> str:
    if r.signal:
        try:
            return f"exit {r.exit_code} ({signal.Signals(r.signal).name})"
        except ValueError:
            return f"exit {r.exit_code} (signal {r.signal})"
    return "exit (unknown)" if r.exit_code is None else f"exit {r.exit_code}"


def deaths(trace: Trace, run: RunRecord) -> None:
    for r in run.ranks:
        if r.ended_at is not None:
            failed = bool(r.signal) or r.exit_code not in (0, None)
            trace.add(instant(rank_pid(r.rank), trace.thread(rank_pid(r.rank), "stalldoc"),
                              trace.us(r.ended_at), exit_name(r), "death" if failed else "exit",
                              "p", {"pid": r.pid, "exit_code": r.exit_code, "signal": r.signal,
                                    "source": r.exit_source}))


def node_process(trace: Trace, run: RunRecord, index: int) -> int:
    pid = NODE_PID + index
    trace.process(pid, node_title(run.node), NODE_PID + index)
    return pid


def stalls(trace: Trace, run: RunRecord, pid: int) -> None:
    tid, end = trace.thread(pid, "stalls"), run_end(run)
    for s in run.stalls:
        args = {"id": s.id, "ranks": list(s.ranks), "threshold_s": s.threshold,
                "phases": dict(s.phases), "ended": s.ended_at is not None}
        stall = Slice(*trace.span(s.started_at, s.ended_at or max(end, s.detected_at)),
                      f"STALL #{s.id}", "stall", args)
        trace.add(complete(pid, tid, stall),
                  instant(pid, tid, trace.us(s.detected_at), f"stall #{s.id} detected", "stall",
                          "g", args))
        for rank in s.ranks:
            phase = s.phases.get(str(rank))
            trace.add(complete(rank_pid(rank), trace.thread(rank_pid(rank), "stalldoc"), Slice(
                stall.ts, stall.dur, f"STALL #{s.id}" + (f" in {phase}" if phase else ""),
                "stall", args)))


def findings(trace: Trace, run: RunRecord, pid: int) -> None:
    tid = trace.thread(pid, "findings")
    for f in run.findings:
        trace.add(instant(pid, tid, trace.us(f.t), f"{f.code} {f.name}", "finding", "t", {
            "severity": f.severity, "ranks": list(f.ranks), "summary": redact_text(f.summary),
            "trigger": f.trigger, "stall": f.stall_id}))


def kill(trace: Trace, run: RunRecord, pid: int) -> None:
    """stalldoc ending the job (--on-stall kill): when the first rank ended after the last
    stall was detected (else when the run ended)."""
    if run.info.ended_by != "stalldoc":
        return
    detected = max((s.detected_at for s in run.stalls), default=0.0)
    after = [r.ended_at for r in run.ranks if r.ended_at is not None and r.ended_at >= detected]
    t = min(after) if after else run.info.ended_at
    if t is not None:
        trace.add(instant(pid, trace.thread(pid, "stalls"), trace.us(t),
                          "stalldoc ended the job (--on-stall kill)", "kill", "g",
                          {"job_exit_code": run.info.exit_code,
                           "watch_exit_code": run.info.watch_exit_code}))


def node_counters(trace: Trace, run: RunRecord, pid: int) -> None:
    for n in run.timeseries.node:
        ts = trace.us(n.t)
        trace.add(counter(pid, ts, "available memory (MiB)", {"available": mib(n.available_bytes)}),
                  counter(pid, ts, "load", {"load1": n.load1}))
    for g in run.timeseries.gpus:
        ts, name = trace.us(g.t), f"GPU {g.gpu}"
        trace.add(counter(pid, ts, f"{name} memory (MiB)", {"used": mib(g.memory_used)}),
                  counter(pid, ts, f"{name} PCIe tx (MB/s)", {"tx": mb(g.pcie_tx_bps)}),
                  counter(pid, ts, f"{name} PCIe rx (MB/s)", {"rx": mb(g.pcie_rx_bps)}),
                  counter(pid, ts, f"{name} util (%)", {"util": g.util_gpu,
                                                               "kernels": g.util_compute}))


def mb(value: float | None) -> float | None:
    return None if value is None else round(value / 1e6, 3)


def other_data(report: Report) -> dict[str, str]:
    runs = report.runs
    return {"run_id": ", ".join(r.info.id for r in runs),
            "command": " ".join(redact_argv(runs[0].info.command)) if runs else "",
            "nodes": ", ".join(r.node for r in runs), "stalldoc_version": __version__,
            "clock": "microseconds since the earliest start, wall clock of every node"}


def start_of(report: Report) -> float:
    times = [report.started_at] + [t for r in report.runs for t in
                                   (*(s.started_at for s in r.spans),
                                    *(c.entered_at for c in r.collectives),
                                    *(p.t for p in r.timeseries.ranks))]
    return min(t for t in times if t) if any(times) else 0.0


def trace(report: Report) -> dict[str, Any]:
    """The whole Trace Event JSON object."""
    out, placed = Trace(start_of(report)), []
    for index, run in enumerate(report.runs):
        rank_processes(out, run, report.merged)
        pid = node_process(out, run, index)
        stalls(out, run, pid)
        kill(out, run, pid)
        findings(out, run, pid)
        phases(out, run)
        sampled_phases(out, run)
        placed += collectives(out, run)
        deaths(out, run)
        rank_counters(out, run)
        node_counters(out, run, pid)
    flows(out, placed)
    other = other_data(report)
    if out.left_out:
        other["slices_left_out"] = f"{out.left_out} (more than the lanes of a thread hold)"
    return {"traceEvents": out.meta + out.events, "displayTimeUnit": "ms", "otherData": other}


class PerfettoReporter:
    name: ClassVar[str] = "perfetto"
    suffix: ClassVar[str] = ".json"

    def render(self, report: Report) -> str:
        return json.dumps(trace(report), separators=(",", ":"))


REPORTER = PerfettoReporter()
