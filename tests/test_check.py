"""`stalldoc check` as a user runs it: the seed articles' cases with swift's own words, the plan,
exit codes, JSON, and `watch --strict`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import watch

GRPO = ["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-7B-Instruct"]


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stalldoc", "check", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


def as_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    out = check("--format", "json", *args, env=env)
    return out.returncode, json.loads(out.stdout)


def test_seed_004_single_gpu_one_generation():
    code, doc = as_json("--", *GRPO, "--num_generations", "1")
    assert code == 1
    [finding] = doc["findings"]
    assert (finding["code"], finding["summary"]) == (
        "SD407", "num_generations must be greater than 1 for GRPO")


def test_seed_000_batch_not_divisible_lists_valid_values():
    # 8 GPUs, per-device batch 1, GA 3 -> 24 completions per generation, 16 generations
    code, doc = as_json("--", *GRPO, "--per_device_train_batch_size", "1",
                        "--gradient_accumulation_steps", "3", "--num_generations", "16",
                        env={"NPROC_PER_NODE": "8"})
    assert code == 1
    [finding] = doc["findings"]
    assert finding["summary"] == ("generation_batch_size (24) must be evenly divisible by "
                                  "num_generations (16). Valid values: [2, 3, 4, 6, 8, 12, 24].")
    assert doc["plan"]["generation_batch_size"] == 24 and doc["plan"]["world_size"] == 8


def test_seed_003_max_steps_from_a_local_dataset(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(8000)))
    code, doc = as_json("--", *GRPO, "--dataset", str(data), "--num_generations", "8",
                        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
                        "--num_iterations", "2", "--num_train_epochs", "1",
                        "--split_dataset_ratio", "0.01", "--per_device_eval_batch_size", "4",
                        env={"NPROC_PER_NODE": "6"})
    assert code == 0, doc["findings"]
    assert doc["plan"]["max_steps"] == 1320 and doc["plan"]["train_prompts"] == 7920
    assert doc["resources"]["dataset_size"] == 8000
    text = check("--", *GRPO, "--dataset", f"{data}#800", env={"NPROC_PER_NODE": "8"}).stdout
    assert "rollouts per epoch R = floor(N*G/Gb) = floor(800*8/8) = 800" in text


def test_warnings_pass_unless_strict():
    argv = ["--gpus", "8", "--", *GRPO, "--use_vllm", "true", "--offload_model", "true",
            "--deepspeed", "zero3_offload"]
    code, doc = as_json(*argv, env={"NPROC_PER_NODE": "8"})
    assert code == 0 and [f["code"] for f in doc["findings"]] == ["SD405"]
    assert check("--strict", *argv, env={"NPROC_PER_NODE": "8"}).returncode == 1


def test_gpus_from_the_user_when_nvml_cannot_say():
    code, doc = as_json("--gpus", "8", "--", *GRPO, env={"NPROC_PER_NODE": "3"})
    assert code == 1 and doc["findings"][0]["summary"].startswith("n_gpu: 8, local_world_size: 3")
    assert doc["resources"]["gpus"] == 8


def test_bad_input_is_one_line_exit_2():
    out = check("--gpu-memory", "plenty", "--", *GRPO)
    assert out.returncode == 2 and out.stderr.strip() == (
        "stalldoc: not a memory size: 'plenty' (e.g. 80G)")


def test_unreadable_config_file_is_one_line_exit_2(tmp_path):
    out = check("--", "swift", "rlhf", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and out.stderr.startswith("stalldoc: cannot read ")
    assert len(out.stderr.strip().splitlines()) == 1


def test_watch_strict_does_not_launch(tmp_path):
    marker = tmp_path / "ran"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    swift = bindir / "swift"
    swift.write_text(f"#!{sys.executable}\nopen({str(marker)!r}, 'w').close()\n")
    swift.chmod(0o755)
    result = watch(tmp_path, [str(swift), "rlhf", "--rlhf_type", "grpo", "--num_generations",
                              "1"], "--strict")
    assert result.code == 125 and not marker.exists()
    assert "[SD407 error]" in result.stderr and "job not launched" in result.stderr
