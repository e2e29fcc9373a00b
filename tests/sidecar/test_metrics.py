"""The exporter's findings come from the ledger, as the store's do: a live `stalldoc watch`
scraped over HTTP while a gloo job hangs agrees with its run database on which findings are
open and which were opened, launch findings included; SIGTERM to watch is stored as an
interrupt with watch's exit code. The run info names the node of a shared run directory."""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import free_port, run_meta, torchrun
from stalldoc.errors import StalldocError
from stalldoc.sidecar.metrics import Exporter, MetricsState
from stalldoc.store.reader import open_reader

HERE = Path(__file__).resolve().parent.parent   # tests/
pytestmark = pytest.mark.timeout(180) if hasattr(pytest.mark, "timeout") else []
Counts = dict[tuple[str, str], int]


def scrape(port: int) -> dict[str, Counts]:
    """The findings families of ``/metrics``: name -> {(code, severity): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found: dict[str, Counts] = {"stalldoc_findings_open": {}, "stalldoc_findings_total": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                key = (sample.labels["code"], sample.labels["severity"])
                found[sample.name][key] = int(sample.value)
    return found


def stored(run_dir: Path) -> dict[str, Counts]:
    """The same, from the run database: rows not resolved, and all rows."""
    with open_reader(run_dir) as conn:
        rows = conn.execute("SELECT code, severity, resolved_at IS NULL FROM findings").fetchall()
    return {"stalldoc_findings_open": dict(Counter((c, s) for c, s, o in rows if o)),
            "stalldoc_findings_total": dict(Counter((c, s) for c, s, _ in rows))}


def agreed(metrics: int, run_dir: Path, timeout: float) -> dict[str, Counts]:
    """Metrics and store, once they agree on a stall's diagnosis (the watcher writes the store
    first and publishes at the end of the same tick)."""
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            last = (scrape(metrics), stored(run_dir))
        except (OSError, sqlite3.Error, StalldocError) as exc:  # not serving, no database yet
            last = (exc, None)
        else:
            if last[0] == last[1] and ("SD101", "error") in last[0]["stalldoc_findings_open"]:
                return last[0]
        time.sleep(0.5)
    raise AssertionError(f"metrics and store never agreed: {last}")


def test_open_findings_in_the_metrics_are_those_of_the_store(tmp_path):
    # GIVEN a job of 3 ranks on a node of 2 (scripted) GPUs, whose rank 1 hangs
    metrics, run_dir = free_port(), tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STUCK_RANK": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE / "nvml_sitecustomize"),
                                          os.environ.get("PYTHONPATH", "")])}
    watch = subprocess.Popen([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                              str(run_dir), "--stall-timeout", "3", "--interval", "0.5",
                              "--kill-grace", "3", "--metrics-port", str(metrics), "--",
                              *torchrun(3, "collective_wait.py")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # WHEN the stall is diagnosed
        seen = agreed(metrics, run_dir, 120)
        # THEN the launch check's finding and the stall's are open in both, opened once
        assert seen["stalldoc_findings_open"][("SD404", "error")] == 1
        assert seen["stalldoc_findings_total"][("SD101", "error")] == 1
        # AND SIGTERM to watch ends the job: an interrupt, with watch's exit code stored
        watch.send_signal(signal.SIGTERM)
        _, stderr = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:   # a failure above: never leave the watcher and its job behind
            for child in psutil.Process(watch.pid).children(recursive=True):
                child.kill()
            watch.kill()
            watch.wait()
    meta = run_meta(run_dir)
    assert (meta["on_stall"], meta["ended_by"]) == ("observe", "interrupt"), stderr
    assert meta["watch_exit_code"] == str(watch.returncode)


def info_labels(port: int) -> list[dict[str, str]]:
    """The labels of ``stalldoc_run_info`` as scraped from ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return [sample.labels for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "stalldoc_run_info"]


def test_the_run_info_names_the_node_of_a_shared_run_directory():
    # GIVEN the exporter of one node of a job whose watchers share a run directory
    exporter = Exporter(0, "127.0.0.1", MetricsState("grpo-7", "host-b", "swift rlhf",
                                                     node_name="node-1"))
    try:
        shared = info_labels(exporter.port)
        # AND then a single-node watch's state, built positionally as watch builds it
        exporter.publish(MetricsState("run", "host-a", "train.py", {}, {}, {}, {}, False, {}, (),
                                      {}, (), {}))
        alone = info_labels(exporter.port)
    finally:
        exporter.close()
    # THEN the run id, host and job name keep their labels; node_name is the node's subdirectory
    assert shared == [{"run_id": "grpo-7", "node": "host-b", "job_name": "swift rlhf",
                       "node_name": "node-1"}]
    assert alone == [{"run_id": "run", "node": "host-a", "job_name": "train.py", "node_name": ""}]


def rank_samples(port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of metric ``name`` scraped from ``/metrics``: labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {tuple(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


def test_a_pure_ddp_loops_collectives_are_in_the_metrics(tmp_path):
    # GIVEN a 2-rank DDP loop, whose only collectives are the reducer's (issued from C++)
    metrics = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STEPS": "40", "STEP_PAUSE": "0.3"}
    watch = subprocess.Popen([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                              str(tmp_path / "run"), "--interval", "0.5", "--metrics-port",
                              str(metrics), "--", *torchrun(2, "ddp_steps.py")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    ranks = [(("rank", "0"),), (("rank", "1"),)]
    full: list[dict] = []   # scrapes with both ranks' collectives issued
    try:
        # WHEN /metrics is scraped while it trains
        deadline = time.time() + 90
        while time.time() < deadline and watch.poll() is None:
            with contextlib.suppress(OSError):
                issued = rank_samples(metrics, "stalldoc_rank_c10d_collectives_issued")
                if all(r in issued for r in ranks):
                    issued["wrapped"] = rank_samples(metrics, "stalldoc_rank_collective_seq")
                    full.append(issued)
            if len(full) >= 2 and all(full[-1][r] > full[0][r] for r in ranks):
                break
            time.sleep(0.5)
        _, stderr = watch.communicate(timeout=90)
    finally:
        if watch.poll() is None:
            for child in psutil.Process(watch.pid).children(recursive=True):
                child.kill()
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, stderr
    # THEN both ranks' collectives issued are there and rise, where the wrapper saw none
    assert len(full) >= 2 and all(full[-1][r] > full[0][r] for r in ranks), full
    assert set(full[-1]) == {*ranks, "wrapped"} and full[-1]["wrapped"] == {}, full
