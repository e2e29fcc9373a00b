"""Several "nodes" on one machine: one `torchrun --nnodes N --node_rank i` per node, each under
its own `stalldoc watch`, all given one shared run directory (as every node of a cluster job
is given one path on the shared filesystem)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import support

SCENARIO = str(support.SCENARIOS / "multinode_shards.py")


def node_command(node: int, nnodes: int, nproc: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node_rank", str(node), "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port), SCENARIO]


def start_nodes(tmp_path: Path, nnodes: int, nproc: int, env: dict[str, str],
                shared: bool = True) -> tuple[list[subprocess.Popen[str]], list[Path]]:
    """One watched `torchrun --nnodes N --node_rank i` per node, each watcher's stderr in
    tmp_path/node<i>.err; all given tmp_path/shared as run directory (else run<i> each)."""
    port = support.free_port()
    logs = [tmp_path / f"node{i}.err" for i in range(nnodes)]
    procs = [support.start_watch(tmp_path / ("shared" if shared else f"run{i}"),
                                 node_command(i, nnodes, nproc, port), env=env,
                                 stderr=logs[i].open("w")) for i in range(nnodes)]
    return procs, logs


def stop(procs: list[subprocess.Popen[str]], timeout: float = 60) -> None:
    """End every node: SIGTERM to each watcher (it ends its job), then SIGKILL whatever of its
    tree is left (the relay is a subreaper: its job would outlive it, orphaned, if killed)."""
    trees = {p.pid: tree(p) for p in procs if p.poll() is None}
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    signal_all([q for t in trees.values() for q in t], signal.SIGKILL)


def signal_all(processes: list[psutil.Process], signum: int) -> None:
    """Signal each process still there (a short-lived one may have ended meanwhile)."""
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.Error:
            pass


def tree(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def stall_job(tmp_path: Path, stuck_rank: int) -> tuple[dict[str, str], Path]:
    shards = tmp_path / "shards"
    shards.mkdir()
    fifo = tmp_path / "stuck-shard.bin"
    os.mkfifo(fifo)
    return {"SHARD_DIR": str(shards), "STUCK_SHARD": str(fifo), "STUCK_RANK": str(stuck_rank),
            "STUCK_STEP": "3"}, fifo


def wait_for(path: Path, text: str, timeout: float = 90) -> str:
    """The first line of ``path`` containing ``text`` (the watcher's stderr goes to a file)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if text in line:
                return line
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not in {path}:\n{path.read_text(errors='replace')}")


def test_two_nodes_name_the_culprit_on_the_other_node_and_merge(tmp_path):
    env, fifo = stall_job(tmp_path, stuck_rank=3)
    shared = tmp_path / "shared"
    procs, logs = start_nodes(tmp_path, 2, 2, env)
    try:
        lines = [wait_for(log, "not in all_reduce") for log in logs]
        # ranks 0-1 on node 0 and rank 2 on node 1 wait; rank 3 on node 1 hangs opening a shard
        for line in lines:
            assert "rank 3 (node 1) not in all_reduce #4 (group world) that ranks 0-2 wait in" \
                in line, line
            assert "rank 3 is in load_shard (" in line and "multinode_shards.py:" in line, line
        with open(fifo, "wb") as fh:      # the mount comes back
            fh.write(b"\0" * 64)
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        stop(procs)
    assert codes == [0, 0], [log.read_text() for log in logs]
    for i, log in enumerate(logs):
        assert "progress resumed" in log.read_text()
        assert (shared / f"node-{i}" / "run.db").exists()
        summary = json.loads((shared / f"node-{i}" / "summary.json").read_text())
        assert summary["state"] == "ended" and summary["label"] == f"node {i}"
    merged = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(shared), "--format",
                             "json"], capture_output=True, text=True, check=True)
    doc = json.loads(merged.stdout)
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2, 3]
    assert doc["nodes"] == ["node 0", "node 1"] and len(doc["runs"]) == 2
    assert doc["runs"][1]["run"]["cluster"]["shared_dir"] == str(shared.resolve())
    culprit = [f for f in doc["findings"] if f["code"] == "SD101"]
    assert culprit and all(f["ranks"] == [3] for f in culprit)
    assert {f["evidence"]["nodes"]["3"] for f in culprit} == {"node 1"}


def test_ranks_waiting_for_a_rank_working_on_another_node_are_not_stalled(tmp_path):
    """Rank 1 (node 1) scores rollouts on the CPU for 12 s while rank 0 (node 0) waits in
    all_reduce: node 0's rank shows no work for four stall timeouts, yet nothing is stalled."""
    env = {"SHARD_DIR": str(tmp_path), "SLOW_RANK": "1", "SLOW_SECONDS": "12", "STEPS": "5"}
    shared = tmp_path / "shared"
    procs, logs = start_nodes(tmp_path, 2, 1, env)
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        stop(procs)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], texts
    assert all("STALL" not in text for text in texts), texts
    rows = json.loads(subprocess.run(
        [sys.executable, "-m", "stalldoc", "report", str(shared), "--format", "json"],
        capture_output=True, text=True, check=True).stdout)
    assert rows["stalls"] == [] and [r["rank"] for r in rows["ranks"]] == [0, 1]


def test_three_nodes_a_frozen_node_is_named_lost_by_the_others(tmp_path):
    """Node 2 freezes whole (its ranks, its launcher and its watcher stopped: a hung host keeps
    its TCP connections open, so the others wait in all_reduce instead of failing)."""
    env = {"SHARD_DIR": str(tmp_path), "STEPS": "400"}
    shared = tmp_path / "shared"
    procs, logs = start_nodes(tmp_path, 3, 1, env)
    frozen: list[psutil.Process] = []
    try:
        for i, log in enumerate(logs):
            wait_for(log, f"rank {i}: pid")
        time.sleep(3)                      # a few steps on every node
        frozen = tree(procs[2])
        signal_all(frozen, signal.SIGSTOP)
        for log in logs[:2]:
            line = wait_for(log, "[SD113 error]")
            assert "node 2 (" in line and "rank 2) published nothing for" in line, line
    finally:
        signal_all(frozen, signal.SIGCONT)
        stop(procs)
    report = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(shared),
                             "--format", "json"], capture_output=True, text=True, check=True)
    doc = json.loads(report.stdout)
    assert doc["nodes"] == ["node 0", "node 1", "node 2"]
    lost = [f for f in doc["findings"] if f["code"] == "SD113"]
    assert {f["node"] for f in lost} == {"node 0", "node 1"}, lost    # said by both others
    assert all(f["ranks"] == [2] and f["evidence"]["label"] == "node 2" for f in lost)


def test_without_a_shared_run_dir_a_node_names_the_ranks_it_waits_for(tmp_path):
    env, fifo = stall_job(tmp_path, stuck_rank=3)
    procs, logs = start_nodes(tmp_path, 2, 2, env, shared=False)
    try:
        waits = wait_for(logs[0], "[SD114 warning]")
        assert ("ranks 0,1 (node 0) wait in all_reduce #4 (group world) for ranks 2,3 on other "
                "nodes (world size 4)") in waits, waits
        local = wait_for(logs[1], "[SD101 error]")
        assert "rank 3 (node 1) not in all_reduce #4 (group world) that rank 2 wait" in local
        assert "without --run-dir" not in logs[0].read_text()   # it was given, just not shared
    finally:
        stop(procs)
    assert "[SD114" not in logs[1].read_text()
