"""`stalldoc check` as a user runs it: the seed articles' cases with swift's own words, the plan,
exit codes, JSON, and `watch --strict`; bad input as one line and exit 2; `launch_checks` within
its time budget."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from stalldoc.check.preflight import launch_checks, run_check
from stalldoc.cli import main
from stalldoc.launch import files
from stalldoc.launch.config import parse_command
from stalldoc.launch.resources import count_rows, dataset_size
from stalldoc.rules.sd402_vllm_tp_layout import VllmTpLayout
from stalldoc.rules.sd404_processes_vs_gpus import ProcessesVsGpus
from support import old_release, watch

GRPO = ["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-7B-Instruct"]


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stalldoc", "check", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=60)


def as_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    out = check("--format", "json", *args, env=env)
    return out.returncode, json.loads(out.stdout)


def test_seed_004_single_gpu_one_generation():
    code, doc = as_json("--", *GRPO, "--num_generations", "1")
    assert code == 1
    [finding] = doc["findings"]
    assert (finding["code"], finding["summary"]) == (
        "SD407", "num_generations must be greater than 1 for GRPO")
    assert list(finding) == ["code", "name", "severity", "ranks", "summary", "evidence", "fix",
                             "trigger"]
    assert (finding["severity"], finding["trigger"]) == ("error", "launch")


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


def test_a_path_with_line_breaks_is_still_one_line_exit_2():
    # found by the fuzz test: a --deepspeed value holding a newline (and a terminal escape)
    out = check("--", *GRPO, "--deepspeed", "ds\nconfig\x1b[2J.json")
    assert out.returncode == 2, out.stderr
    assert out.stderr == "stalldoc: cannot read ds\\nconfig\\x1b[2J.json: No such file or directory\n"


def _fake_swift(tmp_path: Path) -> tuple[Path, Path]:
    """A ``swift`` that only leaves a marker file: whether watch launched the job."""
    marker = tmp_path / "ran"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    swift = bindir / "swift"
    swift.write_text(f"#!{sys.executable}\nopen({str(marker)!r}, 'w').close()\n")
    swift.chmod(0o755)
    return swift, marker


def test_watch_strict_does_not_launch(tmp_path):
    swift, marker = _fake_swift(tmp_path)
    result = watch(tmp_path, [str(swift), "rlhf", "--rlhf_type", "grpo", "--num_generations",
                              "1"], "--strict")
    assert result.code == 125 and not marker.exists()
    assert "[SD407 error]" in result.stderr and "job not launched" in result.stderr


# ----- bad input: one line, exit 2, never a traceback, never a hang ---------------------------
def assert_one_line(out: subprocess.CompletedProcess[str], line: str) -> None:
    assert (out.returncode, out.stderr, out.stdout) == (2, f"stalldoc: {line}\n", "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,env,line", [
    (["--num_generations", "0"], {}, "--num_generations 0: must be a whole number from 1 to "
                                     "1000000"),
    (["--per_device_train_batch_size", "1e11", "--num_generations", "7"], {"NPROC_PER_NODE": "8"},
     "--per_device_train_batch_size 1e11: must be a whole number from 1 to 1000000"),
    (["--num_train_epochs", "inf"], {}, "--num_train_epochs inf: must be a finite number > 0, at "
                                        "most 1000000"),
    (["--num_generations", "7", "--use_vllm", "true"], {"NPROC_PER_NODE": "100000000000"},
     "NPROC_PER_NODE 100000000000: must be a whole number from 1 to 1024"),
])
def test_numbers_out_of_range_are_one_line_exit_2(args, env, line):
    assert_one_line(check("--", *GRPO, *args, env=env), line)


@pytest.mark.timeout(60)
def test_a_fifo_or_dev_zero_as_config_file_is_one_line_exit_2(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    assert_one_line(check("--", "swift", "rlhf", str(tmp_path / "fifo.yaml")),
                    f"cannot read {tmp_path / 'fifo.yaml'}: a FIFO, not a regular file")
    assert_one_line(check("--", *GRPO, "--deepspeed", "/dev/zero"),
                    "cannot read /dev/zero: a character device, not a regular file")


def test_config_shapes_are_one_line_exit_2(tmp_path):
    (tmp_path / "env.yaml").write_text("rlhf_type: grpo\nENV: [NPROC_PER_NODE]\n")
    assert_one_line(check("--", "swift", "rlhf", str(tmp_path / "env.yaml")),
                    f"cannot read {tmp_path / 'env.yaml'}: ENV is a list, not a mapping of "
                    "variable names to values")
    (tmp_path / "ds.json").write_text('{"zero_optimization": "zero3"}')
    assert_one_line(check("--", *GRPO, "--deepspeed", str(tmp_path / "ds.json")),
                    f"cannot read {tmp_path / 'ds.json'}: zero_optimization is a string, not an "
                    "object")


def test_memory_sizes_out_of_range_are_bad_input():
    runner = CliRunner()
    for size, line in (("0", "memory size '0' out of range (1 byte to 1 PiB)"),
                       ("9" * 30 + "G", f"not a memory size: '{'9' * 30}G' (e.g. 80G)")):
        result = runner.invoke(main, ["check", "--gpu-memory", size, "--", *GRPO])
        assert (result.exit_code, result.output) == (2, f"stalldoc: {line}\n")


# ----- datasets: their problems leave the size unknown, with the reason -------------------------
def dataset_note(*entries: str) -> tuple[int | None, str]:
    return dataset_size(parse_command([*GRPO, "--dataset", *entries], {}))


@pytest.mark.timeout(30)
def test_datasets_that_cannot_be_counted_say_why(tmp_path):
    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    (tmp_path / "field.csv").write_text("a,b\n" + "x" * 200_000 + ",1\n")
    (tmp_path / "bytes.csv").write_bytes(b"a\n\xff\n")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock.json"))
        for name, why in (("fifo.jsonl", "a FIFO, not a regular file"),
                          ("zero.jsonl", "a character device, not a regular file"),
                          ("sock.json", "a socket, not a regular file"),
                          ("field.csv", "field larger than field limit (131072)"),
                          ("bytes.csv", "'utf-8' codec can't decode byte 0xff in position 2: "
                                        "invalid start byte")):
            assert dataset_note(str(tmp_path / name)) == (
                None, f"cannot count {tmp_path / name}: {why} (give --dataset-size)")


def test_a_csv_line_too_long_is_refused_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr("stalldoc.launch.resources.CSV_LINE_LIMIT", 1000)
    (tmp_path / "long.csv").write_text("a,b\n" + "x" * 1001)
    assert dataset_note(str(tmp_path / "long.csv"))[1].endswith(
        "a line longer than 0 MiB (give --dataset-size)")


def test_jsonl_rows_are_counted_across_chunks(tmp_path, monkeypatch):
    text = '{"a": 1}\n\n  \n{"b": "' + "y" * 50 + '"}\r\n   {"c": 3}  \n\n{"d": 4}'
    (tmp_path / "d.jsonl").write_text(text)
    expected = sum(1 for line in text.splitlines() if line.strip())
    for chunk in (1, 2, 3, 7, 64, 1 << 20):
        monkeypatch.setattr(files, "CHUNK", chunk)
        assert count_rows(str(tmp_path / "d.jsonl")) == expected == 4


def test_sample_counts_are_ascii_digits_within_reason():
    assert dataset_note("hub/name#2000", "other#300") == (2300, "counted from hub/name#2000, "
                                                                "other#300")
    assert dataset_note("hub/name#²")[0] is None
    assert dataset_note("hub/name#" + "9" * 20)[0] is None


# ----- the time budget ---------------------------------------------------------------------
BAD_LAYOUT = [*GRPO, "--num_generations", "1", "--use_vllm", "true", "--async_generate", "true"]


@pytest.mark.timeout(30)
def test_a_dataset_count_that_never_ends_does_not_hold_the_checks(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr("stalldoc.check.preflight.dataset_size", lambda config: (release.wait(), (1, ""))[1])
    started = time.monotonic()
    checks = launch_checks(parse_command([*BAD_LAYOUT, "--dataset", "d.jsonl"], {}), [], 1.0)
    took = time.monotonic() - started
    release.set()
    assert took < 1.5 and checks.skipped == ("dataset row count (not finished in 0.75 s)",)
    assert {f.code for f in checks.findings} == {"SD403", "SD407"}
    assert checks.resources.dataset_size is None
    assert checks.resources.dataset_note == "not counted within the time budget"
    assert checks.plan is not None and checks.plan.max_steps is None


@pytest.mark.timeout(30)
def test_a_rule_that_never_ends_or_fails_is_named_and_the_others_count(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(VllmTpLayout, "check", lambda self, window: iter([release.wait()]))
    monkeypatch.setattr(ProcessesVsGpus, "check", lambda self, window: iter([1 // 0]))
    checks = launch_checks(parse_command(BAD_LAYOUT, {}), [], 1.0)
    release.set()
    assert checks.skipped == ("SD402 vllm-tp-layout (not finished in 1 s)",
                              "SD404 processes-vs-gpus (error: ZeroDivisionError: integer "
                              "division or modulo by zero)")
    assert {f.code for f in checks.findings} == {"SD403", "SD407"}


def test_a_number_out_of_range_in_watch_names_the_checks_it_stops():
    config = parse_command([*BAD_LAYOUT, "--num_generations", "0"], {"NPROC_PER_NODE": "8"})
    assert config.error == "--num_generations 0: must be a whole number from 1 to 1000000"
    checks = launch_checks(config, [], 5.0)          # watch goes on; it must not raise
    why = f"({config.error})"
    assert checks.plan is None and checks.skipped == (
        f"GRPO plan {why}", f"SD406 generation-batch {why}", f"SD407 num-generations {why}",
        f"SD408 eval-batch {why}")
    assert [f.code for f in checks.findings] == ["SD403"]


def test_run_check_gives_the_same_as_the_rules(monkeypatch):
    monkeypatch.setattr("stalldoc.check.preflight._node_gpus", lambda: [])
    checks = run_check(BAD_LAYOUT, 8, None, 100)
    assert checks.skipped == () and [f.code for f in checks.findings] == ["SD403", "SD407"]
    assert checks.resources.dataset_note == "given with --dataset-size"


def test_skipped_checks_are_printed(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr("stalldoc.check.preflight.dataset_size", lambda config: (release.wait(), (1, ""))[1])
    monkeypatch.setattr("stalldoc.check.preflight._node_gpus", lambda: [])
    result = CliRunner().invoke(main, ["check", "--time-budget", "0.4", "--", *GRPO,
                                       "--num_generations", "2", "--dataset", "d.jsonl"])
    release.set()
    assert result.exit_code == 1
    assert result.output.endswith("  max_steps: unknown (not counted within the time budget)\n"
                                  "skipped: dataset row count (not finished in 0.3 s)\n")
    code, doc = as_json("--", *GRPO, "--num_generations", "2")
    assert doc["skipped"] == [] and doc["resources"]["model_note"] == \
        "Qwen/Qwen2.5-7B-Instruct is not a local directory"


@pytest.mark.timeout(120)
def test_watch_launches_the_job_whatever_the_numbers(tmp_path):
    swift, marker = _fake_swift(tmp_path)
    result = watch(tmp_path, [str(swift), "rlhf", "--rlhf_type", "grpo", "--num_generations",
                              "7", "--per_device_train_batch_size", "100000000000"],
                   env={"NPROC_PER_NODE": "8"})
    assert result.code == 0 and marker.exists()
    assert "--per_device_train_batch_size 100000000000: must be a whole number" in result.stderr
    assert "launch check skipped: GRPO plan (--per_device_train_batch_size" in result.stderr


def test_text_defines_the_letters_and_marks_swifts_defaults(tmp_path):
    data = tmp_path / "x.jsonl"
    data.write_text('{"q": 1}\n')
    out = check("--", *GRPO, "--num_generations", "8", "--per_device_train_batch_size", "4",
                "--dataset", str(data)).stdout
    assert "  B   per_device_train_batch_size  4\n" in out
    assert "  GA  gradient_accumulation_steps  1  swift's default\n" in out
    assert "  N   train prompts                1  the dataset's rows (counted from " in out
    assert "0.5 prompts" not in out and "4 completions: not a whole number of prompts" in out


def test_checks_that_had_nothing_to_read_are_named_instead_of_no_findings():
    out = check("--", "torchrun", "--nproc_per_node", "8", "train.py")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0] == "no findings from the checks that ran"
    assert lines[1] == "not checked (nothing to read):"
    assert "  the swift GRPO checks (SD401-SD403, SD405-SD410): not a swift command " \
           "(torchrun train.py)" in lines
    code, doc = as_json("--", *GRPO, "--use_vllm", "true", "--tuner_type", "full",
                        "--per_device_train_batch_size", "8")
    assert code == 0 and doc["findings"] == []
    assert "model size: vLLM memory budget (SD409), checkpoint size (SD410) " \
           "(Qwen/Qwen2.5-7B-Instruct is not a local directory)" in doc["not_checked"]
    assert doc["plan"]["symbols"][0] == {"symbol": "B", "meaning": "per_device_train_batch_size",
                                         "value": "8", "source": ""}
    assert "num_generations" in doc["plan"]["defaults"]


def test_a_generation_batch_of_one_has_no_valid_values_to_list():
    code, doc = as_json("--", *GRPO)          # swift's defaults: B = W = S = 1, G = 8
    [finding] = doc["findings"]
    assert code == 1 and finding["code"] == "SD406"
    assert finding["summary"].endswith("No num_generations of 2 or more divides 1.")
    assert "[]" not in finding["summary"] and "at least num_generations (8)" in finding["fix"]


# ----- the frameworks of the command's own interpreter (SD411, SD403) -------------------------
@pytest.fixture(scope="module")
def swift_3_4(tmp_path_factory) -> dict[str, str]:
    """ms-swift 3.4.1 and TRL 0.16.1 as released, first on PATH and PYTHONPATH."""
    return old_release(tmp_path_factory.mktemp("old"), "ms-swift==3.4.1", "trl==0.16.1")


def test_a_rollout_server_of_swift_3_4_beside_an_old_trl_is_a_known_clash(swift_3_4):
    # GIVEN `swift rollout` of ms-swift 3.4.1 with TRL 0.16.1 installed (ms-swift#4248: it dies
    # resolving TRL's WeightSyncWorkerExtension, an error that names no version)
    code, doc = as_json("--", "swift", "rollout", "--model", "Qwen/Qwen2.5-7B-Instruct",
                        env=swift_3_4)
    # THEN the clash is named with its thread and fix, as information (its TRL bound is
    # inferred): check passes
    assert code == 0, doc
    [clash] = [f for f in doc["findings"] if f["code"] == "SD411"]
    assert clash["severity"] == "info", clash
    assert clash["summary"].startswith("1 known version clash: C04 ms-swift 3.4.1 + trl 0.16.1 "
                                       "in `swift rollout`: "), clash
    assert "https://github.com/modelscope/ms-swift/issues/4248" in clash["summary"]
    [row] = clash["evidence"]["clashes"]
    assert row["error_line"].startswith("AttributeError: module 'trl.scripts.vllm_serve' has no "
                                        "attribute 'WeightSyncWorkerExtension'")
    assert "the interpreter of swift's #! line" in clash["evidence"]["versions_from"]


ASYNC_GRPO = [*GRPO, "--use_vllm", "true", "--async_generate", "true", "--num_generations", "8",
              "--num_infer_workers", "1"]
SEVEN_AND_ONE = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NPROC_PER_NODE": "7"}


def test_async_generate_beside_one_vllm_gpu_is_swift_3_4s_async_mode(swift_3_4):
    # GIVEN 7 training processes and one inference worker on 8 GPUs, async_generate: swift
    # 3.2-3.4's "async mode" (vLLM on the GPU left over)
    code, doc = as_json("--", *ASYNC_GRPO, env={**swift_3_4, **SEVEN_AND_ONE})
    # THEN with ms-swift 3.4.1 it is no colocation (no SD403)
    assert "SD403" not in [f["code"] for f in doc["findings"]], doc["findings"]
    # AND with the ms-swift 3.5+ this suite installs, the same line is colocated (no vllm_mode is
    # colocate there): SD403
    code, doc = as_json("--", *ASYNC_GRPO, env=SEVEN_AND_ONE)
    [colocated] = [f for f in doc["findings"] if f["code"] == "SD403"]
    assert colocated["evidence"]["vllm_mode"] == "colocate (default)", colocated
    assert code == 1


# Qwen3-30B-A3B's config.json, as its model card publishes it (the fields read here)
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
             "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
             "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
             "vocab_size": 151936, "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
             "tie_word_embeddings": False}


def test_watch_names_the_clash_before_it_launches_and_launches(tmp_path):
    # GIVEN a training script of a Qwen3-MoE model under ZeRO-3, run on this virtualenv's own
    # transformers and DeepSpeed (ms-swift#5875, DeepSpeed#7461: it hangs after loading); the
    # script here only says it started
    model = tmp_path / "Qwen3-30B-A3B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_MOE))
    script = tmp_path / "train.py"
    script.write_text("print('training starts')\n")
    result = watch(tmp_path, [sys.executable, str(script), "--deepspeed", "zero3", "--model",
                              str(model)])
    # THEN the clash is said before the launch and stored as a launch finding, and the job ran
    assert "before launch:" in result.stderr and "C15 transformers " in result.stderr, \
        result.stderr[-3000:]
    [clash] = result.findings("SD411")
    assert clash["trigger"] == "launch" and clash["evidence"]["clashes"][0]["row"] == "C15"
    assert clash["evidence"]["clashes"][0]["layout"] == "for a Qwen3-MoE model under ZeRO-2/3"
    assert result.code == 0 and "training starts" in result.stdout
