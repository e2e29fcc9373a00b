"""A tick of the real probes into the real run store and report, with only ``pynvml`` scripted:
GPU processes are attributed to ranks through the process tree, PCIe traffic to phases, and
memory peaks are kept per rank and per phase."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from fake_pynvml import FakeGpu, FakeNvml
from stalldoc.agent.statefile import StateWriter, state_path
from stalldoc.model.ranks import RankProcess
from stalldoc.report.build import build_report
from stalldoc.report.formats.text import REPORTER as TEXT
from stalldoc.report.read import read_report
from stalldoc.sidecar.sampling import Sampler, rank_of
from stalldoc.store.db import RunStore

GiB = 2**30


@pytest.fixture
def family():
    """A rank process with a child (like a vLLM worker), and a second rank."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
           "'import time; time.sleep(60)']); time.sleep(60)"
    rank0 = subprocess.Popen([sys.executable, "-c", code])
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for _ in range(100):
        children = psutil.Process(rank0.pid).children()
        if children:
            break
        psutil.wait_procs([], timeout=0.05)
    yield rank0.pid, children[0].pid, rank1.pid
    for proc in (rank0, rank1):
        proc.kill()
        proc.wait()
    for child in children:
        child.kill()


def test_rank_of_walks_up_the_tree():
    parents = {30: 20, 20: 10, 10: 1}
    assert rank_of(30, {10: 4}, parents) == 4
    assert rank_of(10, {10: 4}, parents) == 4
    assert rank_of(99, {10: 4}, parents) is None


def test_ticks_land_in_the_report(monkeypatch, tmp_path, family):
    pid0, worker, pid1 = family
    parents = {p.pid: p.ppid() for p in psutil.process_iter()}
    gpu0 = FakeGpu("GPU-0", used=40 * GiB, util=5, processes=[(pid0, 30 * GiB), (worker, 8 * GiB)])
    gpu1 = FakeGpu("GPU-1", used=20 * GiB, util=90, processes=[(pid1, 19 * GiB), (999999, GiB)])
    FakeNvml([gpu0, gpu1]).install(monkeypatch)
    agents = tmp_path / "agents"
    agents.mkdir()
    writers = {pid: StateWriter(state_path(str(agents), pid), pid, rank, rank, 2, 0.0)
               for rank, pid in enumerate((pid0, pid1))}
    ranks = [RankProcess(0, pid0, 0, ("python",)), RankProcess(1, pid1, 1, ("python",))]
    store = RunStore(tmp_path)
    store.start_run("r", ["train.py"], "node", 0.0, 60.0, True)
    sampler = Sampler(str(agents))
    assert sampler.gpus_on and sampler.unavailable == {}

    # WHEN rank 0 offloads (2 GiB/s host->GPU) for 3 ticks, then computes for 2
    for n, phase in enumerate(["offload"] * 3 + ["compute"] * 2):
        writers[pid0].phase_stack([phase])
        writers[pid1].phase_stack(["compute"])
        gpu0.rx_bytes += 2 * GiB if phase == "offload" else 0
        gpu0.used += GiB if phase == "offload" else 0
        store.add_tick(sampler.sample(100.0 + n, ranks, ranks, parents))
    store.close()
    report = build_report(tmp_path)

    # THEN the GPUs, their ranks (the worker counts for rank 0; a stranger for no rank) and peaks
    by_gpu = {g["gpu"]: g for g in report["gpus"]}
    assert by_gpu[0]["ranks"] == [0] and by_gpu[1]["ranks"] == [1]
    assert by_gpu[0]["peak_memory_used"] == 43 * GiB and by_gpu[0]["max_processes"] == 2
    peaks = {w["rank"]: w for w in report["watermarks"]["run"]}
    assert peaks[0]["peak_gpu_memory_bytes"] == 38 * GiB and peaks[1]["peak_gpu_memory_bytes"] == 19 * GiB
    assert peaks[0]["peak_rss_bytes"] > 0
    phases = {(w["phase"], w["rank"]) for w in report["watermarks"]["phases"]}
    assert phases == {("offload", 0), ("compute", 0), ("compute", 1)}
    # AND the PCIe bytes are attributed to the phase the GPU's rank was in
    traffic = {p["phase"]: p for p in report["gpu_phases"]}
    assert traffic["offload"]["pcie_rx_bytes"] == 4 * GiB   # 2 rates x 1 s (the first has none)
    assert traffic["compute"]["pcie_rx_bytes"] == 0
    # AND every probe says it ran, and how long it took
    probes = {p["probe"]: p for p in report["probes"]}
    assert {"host", "node", "nvml", "agent"} <= set(probes)
    assert all(p["runs"] == 5 and p["failures"] == 0 and p["max_seconds"] > 0
               for p in probes.values())
    assert len([r for r in report["timeseries"]["gpus"] if r["gpu"] == 0]) == 5
    # AND the text report says the same
    text = TEXT.render(read_report([tmp_path]))
    rows = [line.split() for line in text.splitlines()]
    assert ["offload", "2.0", "4.0G", "0.0G", "5.0%", "-"] in rows     # no GPM: kernels unknown
    assert ["0", "0", "43.0G", "80.0G", "5.0%", "-", "2"] in rows


def test_a_failing_probe_is_recorded_and_the_others_still_run(monkeypatch, tmp_path):
    FakeNvml([FakeGpu()]).install(monkeypatch)
    sampler = Sampler(None)
    monkeypatch.setattr(sampler.host, "node", lambda now: 1 / 0)
    me = [RankProcess(0, os.getpid(), 0, ("python",))]
    tick = sampler.sample(1.0, me, me, {})
    runs = {r.probe: r for r in tick.probes}
    assert not runs["node"].ok and "ZeroDivisionError" in runs["node"].error
    assert runs["host"].ok and runs["nvml"].ok and tick.node is None
    assert tick.host[0].rss_bytes > 0 and len(tick.gpus) == 1


def test_without_nvml_the_report_says_why(tmp_path):
    store = RunStore(tmp_path)
    store.start_run("r", ["x"], "node", 0.0, 60.0, False)
    sampler = Sampler(None, gpus=False)
    store.probe_unavailable("nvml", sampler.unavailable["nvml"])
    me = [RankProcess(0, os.getpid(), 0, ("python",))]
    store.add_tick(sampler.sample(1.0, me, me, {}))
    store.close()
    probes = {p["probe"]: p for p in build_report(tmp_path)["probes"]}
    assert probes["nvml"]["available"] is False and "--no-gpu" in probes["nvml"]["unavailable"]
    assert probes["host"]["available"] is True


# a launcher with rank 0 and a process whose RANK is beyond 64 bits, each with a forked worker
LAUNCHER = ("import os, subprocess, sys, time\n"
            "rank = \"import os, time\\nif os.fork() == 0:\\n    time.sleep(60)\\ntime.sleep(60)\"\n"
            "ps = [subprocess.Popen([sys.executable, '-c', rank], env={**os.environ, 'RANK': r})"
            " for r in ('0', '99999999999999999999')]\n"
            "print(*(p.pid for p in ps), flush=True)\n"
            "time.sleep(60)")


def test_discovery_reads_the_process_table_once_and_counts_bad_ranks(tmp_path):
    from stalldoc.run.job import JobTree
    job = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    good, bad = (int(pid) for pid in job.stdout.readline().split())
    sampler = Sampler(str(tmp_path), gpus=False)
    tree = JobTree(job.pid, os.getpid())
    try:
        for _ in range(100):   # until both forked workers are there
            found = sampler.discover(tree, None, single=True)
            if len(found.pids) == 5:
                break
            psutil.wait_procs([], timeout=0.05)
        # THEN the job's five processes, rank 0 only; the bad RANK (the process and its worker)
        # counted by the "procs" run
        assert found.pids[0] == job.pid and {good, bad} <= set(found.pids)
        assert [(r.rank, r.pid) for r in found.ranks] == [(0, good)]
        assert found.run.probe == "procs" and found.run.ok and found.run.skipped == 2
        assert found.parents[good] == job.pid and found.parents[job.pid] == os.getpid()
        # AND the tick's host sample comes from that table, the run recorded with the others
        tick = sampler.sample(time.time(), list(found.ranks), list(found.ranks), found.parents,
                              found)
        assert [r.probe for r in tick.probes] == ["procs", "host", "node", "agent"]
        assert tick.host[0].pid == good and tick.host[0].children == 1
    finally:
        for proc in psutil.Process(job.pid).children(recursive=True):
            proc.kill()
        job.kill()
        job.wait()
