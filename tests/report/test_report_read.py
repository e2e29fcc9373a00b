"""The typed run reader: runs of several nodes merged into one report, and the JSON document
written from the records."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.work import StallEpisode
from stalldoc.report.document import document
from stalldoc.report.read import read_report
from stalldoc.store.db import RunStore

from support import demo_run


def node_run(run_dir: Path, host: str, ranks: range, started: float, culprit: int) -> Path:
    """A node's run as its watcher stores it: its ranks (global numbers), a stall in which
    ``culprit`` is blamed, and the stacks of its ranks."""
    run_dir.mkdir(parents=True)
    store = RunStore(run_dir)
    store.start_run(run_dir.name, ["torchrun", "--nnodes", "2", "train.py"], host, started, 45.0,
                    True)
    for rank in ranks:
        store.add_rank(RankProcess(rank, 100 + rank, rank % 2, ("python", "train.py")),
                       started + 1)
    store.save_stall(StallEpisode(1, started + 10, started + 55, 45.0, tuple(ranks)))
    frames = (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2500),
              Frame("train_step", "train.py", 42))
    store.add_stacks(1, [RankStacks(r, 100 + r, started + 55, "py-spy",
                                    (ThreadStack(100 + r, "MainThread", False, False, frames),))
                         for r in ranks])
    store.put_findings(Ledger().stall(started + 56, 1, [Finding(
        "SD101", "rank-outside-collective", Severity.ERROR, (culprit,),
        f"rank {culprit} not in all_reduce #42", {"frames": []}, "look at rank's frame")]).entries)
    store.end_run(started + 60, 1)
    store.close()
    return run_dir


def test_two_nodes_merge_into_one_report_with_global_ranks_and_node_names(tmp_path):
    # GIVEN two nodes' runs of one job, node b's watcher started 3 s after node a's
    a = node_run(tmp_path / "job" / "node-a", "gpu-a", range(0, 2), 1000.0, culprit=3)
    b = node_run(tmp_path / "job" / "node-b", "gpu-b", range(2, 4), 1003.0, culprit=3)
    # WHEN both directories are read, or their parent holding both
    by_dirs = read_report([b, a])
    by_parent = read_report([tmp_path / "job"])
    # THEN it is one report of both nodes, ordered by wall time, ranks 0-3 with their node
    for report in (by_dirs, by_parent):
        assert report.merged and [r.node for r in report.runs] == ["gpu-a", "gpu-b"]
        assert [(r.rank, r.node) for r in report.ranks] == [
            (0, "gpu-a"), (1, "gpu-a"), (2, "gpu-b"), (3, "gpu-b")]
        assert report.started_at == 1000.0
        assert [(f.node, f.ranks) for f in report.findings] == [("gpu-a", (3,)), ("gpu-b", (3,))]
    # AND the JSON names the nodes, keeps each node's document and merges the rows
    doc = json.loads(json.dumps(document(by_dirs)))
    assert doc["nodes"] == ["gpu-a", "gpu-b"]
    assert [r["run"]["node"] for r in doc["runs"]] == ["gpu-a", "gpu-b"]
    assert {(s["node"], s["id"]) for s in doc["stalls"]} == {("gpu-a", 1), ("gpu-b", 1)}
    assert [s["rank"] for s in doc["stacks"]] == [0, 1, 2, 3]


def test_nodes_on_one_host_are_told_apart_by_their_directories(tmp_path):
    node_run(tmp_path / "job" / "node0", "vm", range(0, 2), 1000.0, culprit=1)
    node_run(tmp_path / "job" / "node1", "vm", range(2, 4), 1001.0, culprit=1)
    report = read_report([tmp_path / "job"])
    assert [r.node for r in report.runs] == ["vm:node0", "vm:node1"]
    assert {r.node for r in report.ranks} == {"vm:node0", "vm:node1"}


def test_merged_text_and_json_from_the_command_line(tmp_path):
    node_run(tmp_path / "job" / "node-a", "gpu-a", range(0, 2), 1000.0, culprit=3)
    node_run(tmp_path / "job" / "node-b", "gpu-b", range(2, 4), 1003.0, culprit=3)
    out = tmp_path / "report.json"
    cli = [sys.executable, "-m", "stalldoc", "report"]
    done = subprocess.run([*cli, str(tmp_path / "job"), "--format", "json", "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert json.loads(out.read_text())["nodes"] == ["gpu-a", "gpu-b"]
    text = subprocess.run([*cli, str(tmp_path / "job" / "node-a"), str(tmp_path / "job" / "node-b")],
                          capture_output=True, text=True).stdout
    assert "[SD101 error] rank 3 not in all_reduce #42 on gpu-b" in text
    assert "Stack at stall #1 on gpu-b: ranks 2,3 (waiting: collective)" in text


def test_a_report_file_that_cannot_be_written_is_one_line_exit_1(tmp_path):
    run = node_run(tmp_path / "run", "vm", range(0, 2), 1000.0, culprit=1)
    done = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(run), "-o",
                           str(tmp_path / "no" / "such" / "dir" / "r.txt")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("stalldoc: cannot write ")


def test_one_run_keeps_the_documented_shape(tmp_path):
    # the records written back as the JSON contract: every documented top-level field, rows
    # without a node (a single run), and the stacks' threads as they were stored
    doc = document(read_report([demo_run()]))
    assert set(doc) >= {"run", "ranks", "stalls", "findings", "stacks", "phases", "host", "gpus",
                        "gpu_phases", "watermarks", "probes", "timeseries", "flight_dumps"}
    assert "node" not in doc["ranks"][0] and "nodes" not in doc
    frames = doc["stacks"][0]["threads"][0]["frames"]
    assert set(frames[0]) == {"function", "filename", "line"}
    assert [f["code"] for f in doc["findings"] if f["code"] == "SD101"] == ["SD101"]
