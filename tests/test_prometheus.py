"""A real Prometheus on 127.0.0.1 scraping a live `stalldoc watch` of a hanging gloo job, with the
alert rules loaded: every dashboard panel's query returns data (the collective lag's recorded by
the rules), stalldoc_stall_active goes 0 -> 1, and SIGTERM ends the job tree and the endpoint.
Two scripted GPUs (pynvml functions only) feed the GPU panels. Two in-process exporters, two
nodes of one run, are joined by the cross-node collective-lag rules."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest

from support import free_port, torchrun
from stalldoc.sidecar.metrics import Exporter, MetricsState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "grafana"))
import generate  # noqa: E402

REQUIRED = os.environ.get("STALLDOC_REQUIRE_PROMETHEUS") == "1"
pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None and not REQUIRED,
                                reason="needs Debian's prometheus package")
HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "grafana" / "alerts" / "stalldoc.rules.yml"


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())["data"]["result"]


def query_range(port: int, expr: str, start: float, end: float) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": "1"})
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())["data"]["result"]


def wait_for(check, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def start_prometheus(tmp_path: Path, *targets: int,
                     rules: Path | None = None) -> tuple[subprocess.Popen, int]:
    """A Prometheus scraping TARGETS every second, evaluating RULES (if any) every second."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    listed = ", ".join(f"'127.0.0.1:{target}'" for target in targets)
    loaded = f"rule_files:\n  - '{rules}'\n" if rules else ""
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{loaded}"
                      f"scrape_configs:\n  - job_name: stalldoc\n"
                      f"    static_configs:\n      - targets: [{listed}]\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def test_prometheus_scrapes_a_live_watch(tmp_path):
    metrics = free_port()
    # (each step marked as a phase: the step-share panels have data after 5 of them)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STUCK_RANK": "1", "STUCK_STEP": "8",
           "STEP_PHASE": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE / "nvml_sitecustomize"),
                                          os.environ.get("PYTHONPATH", "")])}
    watch = subprocess.Popen([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                              str(tmp_path / "run"), "--stall-timeout", "4", "--interval", "0.5",
                              "--kill-grace", "3", "--metrics-port", str(metrics), "--",
                              *torchrun(2, "collective_wait.py")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    prometheus, port = start_prometheus(tmp_path, metrics, rules=RULES)
    try:
        job = check_scraped(port, watch, time.time())
        # AND SIGTERM ends the job tree and the endpoint
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=60)
        assert not [pid for pid in job if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", metrics), timeout=2).close()
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        if watch.poll() is None:  # a failure above: never leave the watcher and its job behind
            for child in psutil.Process(watch.pid).children(recursive=True):
                child.kill()
            watch.kill()
            watch.wait()


def check_scraped(port: int, watch: subprocess.Popen, started: float) -> list[int]:
    """What Prometheus holds of the live watch; returns the job's pids."""
    # stalldoc_stall_active is scraped as 0, then turns 1 once the stall is detected
    wait_for(lambda: query(port, "stalldoc_stall_active == 1"), 90, "a stall")
    time.sleep(1.5)
    history = query_range(port, "stalldoc_stall_active", started, time.time())
    values = [float(v) for _, v in history[0]["values"]]
    assert values[0] == 0.0 and values[-1] == 1.0 and values.index(1.0) > 0
    # every dashboard panel's query returns data (rates need two scrapes in the window)
    time.sleep(3)
    for uid, _, title, _, expr, _ in generate.PANELS:
        expr = expr.replace("$instance", ".*")
        assert wait_for(lambda: query(port, expr), 20, f"{uid} / {title}: {expr}"), title
    [info] = query(port, "stalldoc_run_info")
    assert (info["metric"]["job_name"], info["metric"]["run_id"]) == ("collective_wait.py", "run")
    job = [p.pid for p in psutil.Process(watch.pid).children(recursive=True)]
    assert job
    return job


def test_the_collective_lag_rules_join_two_nodes_of_one_run(tmp_path):
    # GIVEN two nodes' watchers of one job (one shared run directory: the same run_id), node-0
    # with ranks 0-1 and node-1 with ranks 2-3, in the world group and group "1" (ranks 0 and 2)
    world = {0: 40, 1: 41, 2: 38, 3: 41}
    sub = {0: 12, 2: 12}
    nodes = [Exporter(0, "127.0.0.1", MetricsState(
        "grpo-7", f"host-{i}", "swift rlhf", node_name=f"node-{i}", collective_seq={
            **{(r, "world"): world[r] for r in ranks},
            **{(r, "1"): sub[r] for r in ranks if r in sub}}))
        for i, ranks in enumerate(((0, 1), (2, 3)))]
    # WHEN a real Prometheus scrapes both with the alert rules loaded
    prometheus, port = start_prometheus(tmp_path, *(n.port for n in nodes), rules=RULES)
    try:
        # (every rank of both nodes in the joined series: the lag rules of the same evaluation
        # saw them all)
        wait_for(lambda: len(query(port, "run_id_group_rank:stalldoc_rank_collective_seq:info"))
                 == 6, 60, "both nodes' ranks joined to their run")
        lag = {r["metric"]["group"]: float(r["value"][1]) for r in
               query(port, 'run_id_group:stalldoc_rank_collective_seq:max_minus_min')}
        lowest = [(r["metric"]["rank"], r["metric"]["node_name"], float(r["value"][1])) for r in
                  query(port, "run_id_group_rank:stalldoc_rank_collective_seq:lowest")]
        info = query(port, "stalldoc_run_info")
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        for node in nodes:
            node.close()
    # THEN the lag per group is max minus min of what the two nodes published
    assert lag == {"world": max(world.values()) - min(world.values()), "1": 0.0}
    # AND the rank furthest behind is named with its node (how far behind as the value)
    assert lowest == [("2", "node-1", 3.0)]
    assert sorted((i["metric"]["run_id"], i["metric"]["node_name"]) for i in info) == [
        ("grpo-7", "node-0"), ("grpo-7", "node-1")]


def test_dashboards_are_generated_from_code_and_committed():
    for uid in generate.TITLES:
        committed = (HERE.parent / "grafana" / "dashboards" / f"{uid}.json").read_text()
        assert committed == generate.render(uid), f"run python grafana/generate.py ({uid})"
    queries = {p[4] for p in generate.PANELS}
    for name in ("stalldoc_rank_seconds_since_progress", "stalldoc_rank_phase",
                 "stalldoc_stall_active", "stalldoc_findings_total",
                 "stalldoc_gpu_memory_used_bytes", "stalldoc_gpu_pcie_bytes_per_second",
                 "stalldoc_probe_success",
                 "run_id_group:stalldoc_rank_collective_seq:max_minus_min",
                 "run_id_group_rank:stalldoc_rank_collective_seq:lowest"):
        assert any(name in q for q in queries), name


def test_alert_rules_check_and_unit_tests_pass():
    if shutil.which("promtool") is None:
        pytest.skip("needs promtool (Debian's prometheus package)")
    alerts = HERE.parent / "grafana" / "alerts"
    for args in (["check", "rules", "stalldoc.rules.yml"], ["test", "rules",
                                                            "stalldoc.rules.test.yml"]):
        out = subprocess.run(["promtool", *args], cwd=alerts, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(["promtool", "check", "config", "prometheus.example.yml"],
                         cwd=alerts.parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
