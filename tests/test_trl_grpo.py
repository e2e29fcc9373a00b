"""TRL's own command line, run as its docs run it: ``trl grpo --model_name_or_path ...
--reward_funcs module.func``, on the CPU with a tiny Qwen2 model built here. ``trl grpo`` runs
``accelerate launch`` inside its own process, which starts the training script
(``trl/scripts/grpo.py``) as its child and waits for it: that child is the job's one rank, never
the CLI waiting on it. Healthy: it trains to its end, no stall, no alarm. A reward function
waiting on a verifier that never answers: the stall is named in the training process, the server
and the reward's own frame (SD107), not the CLI's wait for its child."""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Iterator

import pytest

import tiny_swift
from load import cpu_burner
from support import SCENARIOS, Result, alarms, watch
from test_launcher_ranks import job_pid

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny model, and a prompt-only math dataset in the conversational form TRL's GRPO
    reads (``load_dataset`` of a directory holding ``train.jsonl``)."""
    pytest.importorskip("trl")
    root = tmp_path_factory.mktemp("trl")
    tiny_swift.build_model(root / "model")
    (root / "data").mkdir()
    rows = [{"prompt": row["messages"], "solution": row["solution"]}
            for row in tiny_swift.questions(16)]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture
def silent_verifier() -> Iterator[str]:
    """A verifier's address that takes connections and never answers (listening, never
    accepting: the kernel completes the handshake, the request waits for a reply)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/score"


def trl_grpo(tmp_path: Path, tiny: Path, steps: int, env: dict[str, str], loaded: bool,
             *options: str) -> Result:
    trl = str(Path(sys.executable).parent / "trl")
    command = [trl, "grpo", "--model_name_or_path", str(tiny / "model"),
               "--dataset_name", str(tiny / "data"),
               "--reward_funcs", "trl_verifier.verified_reward",
               "--output_dir", str(tmp_path / "out"), "--max_steps", str(steps),
               "--per_device_train_batch_size", "2", "--num_generations", "2",
               "--max_completion_length", "12", "--logging_steps", "1", "--report_to", "none",
               "--save_strategy", "no", "--bf16", "false", "--use_cpu", "true"]
    full_env = {**tiny_swift.OFFLINE, "PYTHONPATH": str(SCENARIOS), **env}
    with cpu_burner(2 if loaded else 0):
        return watch(tmp_path, command, *options, env=full_env, timeout=360)


def training_process(result: Result) -> dict:
    """The one rank: the process running TRL's training script, not the CLI."""
    [rank] = result.report()["ranks"]
    assert rank["pid"] != job_pid(result), rank
    assert "trl/scripts/grpo.py" in " ".join(rank["cmdline"]), rank
    return rank


@pytest.mark.parametrize("loaded", [True], ids=["cpu-burner"])   # healthy: under load
def test_trl_grpo_healthy_run_is_its_training_process(tmp_path: Path, tiny: Path,
                                                      loaded: bool) -> None:
    # GIVEN `trl grpo` for 3 steps, its reward scored in the training process, watched with the
    # kill action armed (a false stall would end a healthy run)
    result = trl_grpo(tmp_path, tiny, 3, {}, loaded, "--on-stall", "kill")
    # THEN it trains to its end: no stall, no alarm, and the rank is the training script
    assert result.code == 0, result.stderr[-3000:]
    assert "reward call 3" in result.stdout, result.stdout[-2000:]
    report = result.report()
    assert report["stalls"] == [] and alarms(report) == [], result.stderr[-3000:]
    training_process(result)


def test_trl_grpo_reward_waiting_on_a_silent_verifier_is_named(tmp_path: Path, tiny: Path,
                                                               silent_verifier: str) -> None:
    # GIVEN `trl grpo` whose reward function asks a verifier from its second call on, the
    # verifier never answering
    env = {"VERIFIER_URL": silent_verifier, "STUCK_CALL": "2"}
    result = trl_grpo(tmp_path, tiny, 40, env, False, "--on-stall", "kill")
    # THEN a stall, ended by the kill action, named in the training process: it waits for the
    # verifier's reply, from the reward function's call
    assert result.code == 124, result.stderr[-3000:]
    assert "reward call 2" in result.stdout and "reward call 3" not in result.stdout
    rank = training_process(result)
    [finding] = result.findings("SD107")
    assert finding["ranks"] == [0] and rank["rank"] == 0
    port = silent_verifier.split(":")[2].split("/")[0]
    assert finding["evidence"]["peers"] == [f"127.0.0.1:{port}"], finding["evidence"]
    assert finding["evidence"]["frame"].startswith("ask_verifier ("), finding["evidence"]
