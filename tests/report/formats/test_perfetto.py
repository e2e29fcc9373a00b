"""``stalldoc report --format perfetto``: the real demo run (a torchrun gloo job whose rank 1
hangs; stalldoc kills it) exported as Chrome Trace Event JSON keeps the format's rules and is
read by Chrome DevTools' trace engine (in headless Chromium): three rank processes, the
all_reduce calls as slices with flows linking each call across ranks, the stall, the ranks'
deaths, stalldoc's kill. Runs of two nodes merged carry node-qualified process names."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from support import demo_run, run_record, synthetic_tick
from trace_consumers import chromium, devtools_parse, trace_errors
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.model.work import StallEpisode
from stalldoc.report.formats import FORMATS, reporter
from stalldoc.report.read import read_report
from stalldoc.report.records import CollectiveSpan, RankRecord, Report
from stalldoc.store.db import RunStore

T0 = 1_700_000_000.0
needs_chromium = pytest.mark.skipif(chromium() is None, reason="no Chromium on PATH")


def stalldoc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stalldoc", *args], capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """The demo's run directory and its trace, written by ``stalldoc report -o``."""
    run_dir, out = demo_run(), tmp_path_factory.mktemp("demo") / "trace.json"
    exported = stalldoc("report", str(run_dir), "--format", "perfetto", "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    return run_dir, json.loads(out.read_text())


def by_phase(trace: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def names(trace: dict[str, Any], what: str) -> dict[Any, str]:
    """process_name by pid, or thread_name by (pid, tid)."""
    return {(e["pid"] if what == "process_name" else (e["pid"], e["tid"])): e["args"]["name"]
            for e in by_phase(trace, "M") if e["name"] == what}


def test_perfetto_is_a_format():
    assert "perfetto" in FORMATS and reporter("perfetto").suffix == ".json"


def test_the_demo_trace_keeps_the_format_rules(demo):
    run_dir, trace = demo
    assert trace_errors(trace) == []
    processes = names(trace, "process_name")
    assert [processes[pid] for pid in (1, 2, 3)] == ["rank 0", "rank 1", "rank 2"]
    assert {e["pid"]: e["args"]["sort_index"] for e in by_phase(trace, "M")
            if e["name"] == "process_sort_index" and e["pid"] < 4} == {1: 0, 2: 1, 3: 2}
    info = read_report([run_dir]).runs[0].info
    assert trace["otherData"]["run_id"] == info.id and trace["displayTimeUnit"] == "ms"
    assert "torch.distributed.run" in trace["otherData"]["command"]
    assert min(e["ts"] for e in trace["traceEvents"] if e["ph"] != "M") >= 0


def test_the_demo_collectives_are_slices_linked_across_ranks(demo):
    _, trace = demo
    threads = names(trace, "thread_name")
    calls = defaultdict(dict)
    for e in by_phase(trace, "X"):
        if e["cat"] == "collective":
            assert threads[(e["pid"], e["tid"])] == "collectives world"
            calls[e["args"]["seq"]][e["pid"]] = e
    done = [seq for seq, by_pid in calls.items() if not any(e["args"]["pending"]
                                                            for e in by_pid.values())]
    assert done and all(set(calls[seq]) == {1, 2, 3} for seq in done)
    hung = max(calls)                  # ranks 0 and 2 wait in it, rank 1 never came
    assert set(calls[hung]) == {1, 3} and calls[hung][1]["name"] == f"all_reduce #{hung} (pending)"
    flows = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] in "stf":
            flows[e["id"]].append(e)
    linked = {}
    for chain in flows.values():
        seq = int(chain[0]["name"].split("#")[1].split()[0])
        assert [e["ts"] for e in chain] == sorted(calls[seq][e["pid"]]["ts"] for e in chain)
        linked[seq] = {e["pid"] for e in chain}
    assert linked == {seq: set(by_pid) for seq, by_pid in calls.items()}


def test_the_demo_stall_deaths_and_kill(demo):
    run_dir, trace = demo
    run = read_report([run_dir]).runs[0]
    stall = [e for e in by_phase(trace, "X") if e["name"] == "STALL #1"]
    assert len(stall) == 1 and stall[0]["args"]["ranks"] == [0, 1, 2]
    assert any(e["name"] == "STALL #1 in data" and e["pid"] == 2 for e in by_phase(trace, "X"))
    detected = [e for e in by_phase(trace, "i") if e["name"] == "stall #1 detected"]
    assert detected and detected[0]["s"] == "g"
    # every rank's end is on its process, as the report stored it. torchrun reaps the ranks it
    # SIGTERMs within milliseconds, so the watcher reads some statuses from /proc (143, SIGTERM)
    # and, on a busy machine, misses others (unknown): both are true, a clean exit never is
    ends = {e["pid"]: e for e in by_phase(trace, "i") if e["cat"] in ("death", "exit")}
    assert sorted(ends) == [1, 2, 3] == sorted(r.rank + 1 for r in run.ranks)
    for r in run.ranks:
        end = ends[r.rank + 1]
        assert ((r.exit_code, r.signal) == (143, 15) and r.exit_source in SAW) or (
            (r.exit_code, r.signal, r.exit_source) == (None, None, "unknown")), r
        assert (end["name"], end["cat"]) == ending(r)
        assert end["args"] == {"pid": r.pid, "exit_code": r.exit_code, "signal": r.signal,
                               "source": r.exit_source}
        assert end["ts"] >= detected[0]["ts"]
    # stalldoc's kill, once: when the first rank ended after the stall was detected
    assert run.info.ended_by == "stalldoc"
    [kill] = [e for e in by_phase(trace, "i") if e["cat"] == "kill"]
    assert kill["ts"] == min(e["ts"] for e in ends.values()) and kill["s"] == "g"
    assert any(e["name"] == "SD101 rank-outside-collective" for e in by_phase(trace, "i"))


SAW = ("proc", "relay", "launcher-log")      # the sources that saw a rank's status


def ending(r: RankRecord) -> tuple[str, str]:
    """The name and category of the instant a rank's stored exit must give in the trace."""
    if r.signal:
        return f"exit {r.exit_code} ({signal.Signals(r.signal).name})", "death"
    if r.exit_code is None:
        return "exit (unknown)", "exit"
    return f"exit {r.exit_code}", "death" if r.exit_code else "exit"


def test_every_way_a_rank_ends_is_on_its_process():
    # killed by SIGTERM (read from /proc), a status nobody saw (the launcher reaped it first),
    # an exit 1 from the launcher's log and a clean exit
    ways = ((143, 15, "proc"), (None, None, "unknown"), (1, None, "launcher-log"),
            (0, None, "launcher"))
    ranks = tuple(RankRecord(r, 100 + r, r, ("python",), T0, T0 + 10 + r, code, sig, source,
                             "node") for r, (code, sig, source) in enumerate(ways))
    trace = json.loads(reporter("perfetto").render(Report((run_record(ranks=ranks),))))
    ends = {e["pid"]: e for e in by_phase(trace, "i") if e["cat"] in ("death", "exit")}
    assert {pid: (e["name"], e["cat"], e["args"]["source"]) for pid, e in ends.items()} == {
        1: ("exit 143 (SIGTERM)", "death", "proc"), 2: ("exit (unknown)", "exit", "unknown"),
        3: ("exit 1", "death", "launcher-log"), 4: ("exit 0", "exit", "launcher")}
    assert [e["ts"] for _, e in sorted(ends.items())] == sorted(e["ts"] for e in ends.values())
    [kill] = [e for e in by_phase(trace, "i") if e["cat"] == "kill"]    # no stall: the first end
    assert kill["ts"] == ends[1]["ts"]


@needs_chromium
def test_devtools_reads_the_demo_trace(demo):
    _, trace = demo
    seen = devtools_parse(trace)
    assert {seen["names"][p] for p in ("1", "2", "3")} == {"rank 0", "rank 1", "rank 2"}
    slices = {pid: [n for thread in seen["processes"][pid].values() for n in thread]
              for pid in ("1", "2", "3")}
    assert "all_reduce #1" in slices["1"] and "STALL #1 in data" in slices["2"]
    ours = sum(1 for e in by_phase(trace, "X") if e["pid"] < 4)
    assert sum(len(s) for s in slices.values()) == ours     # every rank slice placed
    chains = {tuple(sorted(pid for pid, *_ in f)): {name for *_, name in f} for f in seen["flows"]}
    assert chains and all(len(n) == 1 and next(iter(n)).startswith("all_reduce #") for n in
                          chains.values())
    # the hung call: ranks 0 and 2 (should it fail: every collective slice, and every flow)
    calls = sorted((e["pid"], e["tid"], e["name"], e["ts"], e["dur"]) for e in by_phase(trace, "X")
                   if e["cat"] == "collective")
    assert (1, 2, 3) in chains and (1, 3) in chains, (calls, seen["flows"])


@needs_chromium
def test_ranks_that_read_one_clock_value_on_entering_a_call_keep_their_arrow():
    """Two ranks woken by one scheduler tick read the same wall-clock value as they enter a
    call (a loaded CI run: ranks 0 and 2 entered the demo's hung all_reduce #7 at one float of
    time.time()). DevTools keys a flow's slices by their start: each must keep its own."""
    t = T0 + 2.0
    calls = tuple(CollectiveSpan(r, "world", seq, "all_reduce", 4096, "float32", t + seq,
                                 t + seq + 0.25 if seq == 1 else None)
                  for seq in (1, 2) for r in (0, 1))
    trace = json.loads(reporter("perfetto").render(Report((run_record(collectives=calls),))))
    assert trace_errors(trace) == []
    starts = defaultdict(list)
    for e in by_phase(trace, "X"):
        if e["cat"] == "collective":
            starts[e["args"]["seq"]].append(e["ts"])
    assert all(len(set(ts)) == 2 and max(ts) - min(ts) < 0.01 for ts in starts.values()), starts
    chains = sorted((sorted(pid for pid, *_ in f), {name for *_, name in f})
                    for f in devtools_parse(trace)["flows"])
    assert chains == [([1, 2], {"all_reduce #1"}), ([1, 2], {"all_reduce #2 (pending)"})]


# ----- two nodes merged ------------------------------------------------------------------------
def ring(i: int, rank: int) -> GroupState:
    """Rank ``rank``'s ring at tick ``i``: an all_gather a second, the 15th never completes."""
    calls = tuple(CollectiveRecord("world", s, "all_gather", 8, "bfloat16", T0 + s + rank * 0.01,
                                   T0 + s + 0.2 if s < 15 else None, False)
                  for s in range(1, min(i, 15) + 1))
    return GroupState("world", len(calls), len(calls), calls)


def node_run(run_dir: Path, node: str, ranks: tuple[int, int], killed: bool) -> None:
    """A node's run written through the real store: two ranks, their collectives, GPUs."""
    run_dir.mkdir()
    store = RunStore(run_dir)
    store.start_run(run_dir.name, ["torchrun", "--nnodes", "2", "train.py", "--hf_token",
                                   "hf_abcdefghijklmnopqrstuvwxyz0123"], node, T0, 45, True)
    for r in ranks:
        store.add_rank(RankProcess(r, 100 + r, r % 2, ("python", "train.py")), T0)
    for i in range(1, 20):
        tick = synthetic_tick(T0 + i, 2, 2, "train")
        agents = {ranks[k]: dataclasses.replace(a, rank=ranks[k], groups=(ring(i, ranks[k]),))
                  for k, a in enumerate(tick.agents.values())}
        host = {ranks[k]: dataclasses.replace(h, rank=ranks[k])
                for k, h in enumerate(tick.host.values())}
        store.add_tick(dataclasses.replace(tick, agents=agents, host=host))
    store.save_stall(StallEpisode(1, T0 + 15.5, T0 + 18, 2.5, ranks))
    store.put_findings(Ledger().stall(T0 + 18, 1, [Finding(
        "SD101", "rank-outside-collective", Severity.ERROR, (ranks[0],), "rank waits", {},
        "look")]).entries)
    if killed:
        store.set_meta("ended_by", "stalldoc")
    for r in ranks:
        store.rank_exit(RankExit(r, 100 + r, T0 + 19.5, 143, 15, "proc"))
    store.end_run(T0 + 20, 1)
    store.close()


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> dict[str, Any]:
    job = tmp_path_factory.mktemp("job")
    node_run(job / "node-a", "host-a", (0, 1), killed=True)
    node_run(job / "node-b", "host-b", (2, 3), killed=False)
    return json.loads(reporter("perfetto").render(read_report([job])))


def test_merged_runs_have_node_qualified_processes(merged):
    assert trace_errors(merged) == []
    processes = names(merged, "process_name")
    assert [processes[r + 1] for r in range(4)] == ["host-a rank 0", "host-a rank 1",
                                                    "host-b rank 2", "host-b rank 3"]
    assert {processes[1_000_000], processes[1_000_001]} == {"node host-a", "node host-b"}
    flows = defaultdict(set)
    for e in merged["traceEvents"]:
        if e["ph"] in "stf":
            flows[e["name"]].add(e["pid"])
    assert flows["all_gather #3 (world)"] == {1, 2, 3, 4}        # across both nodes
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in json.dumps(merged)
    kills = [e for e in by_phase(merged, "i") if e["cat"] == "kill"]
    assert len(kills) == 1 and kills[0]["s"] == "g"
    counters = {e["name"] for e in by_phase(merged, "C")}
    assert {"memory (MiB)", "GPU 0 memory (MiB)", "GPU 1 PCIe tx (MB/s)",
            "available memory (MiB)"} <= counters


@needs_chromium
def test_devtools_reads_the_merged_trace(merged):
    seen = devtools_parse(merged)
    assert {seen["names"][str(r + 1)] for r in range(4)} == {
        "host-a rank 0", "host-a rank 1", "host-b rank 2", "host-b rank 3"}
    assert {tuple(sorted(pid for pid, *_ in f)) for f in seen["flows"]} == {(1, 2, 3, 4)}
    assert len(seen["flows"]) == 15
