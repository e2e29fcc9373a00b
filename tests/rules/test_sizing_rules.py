"""SD409 / SD410 before launch, with model sizes read from real configs (Qwen2.5 7B and 32B,
their published config.json numbers) written into local model directories."""
from __future__ import annotations

import json
import os

import pytest

from stalldoc.launch.config import parse_command
from stalldoc.launch.resources import Resources, model_info, read_model
from stalldoc.model.findings import Severity
from stalldoc.model.window import Window
from stalldoc.rules import by_code

GiB = 2**30
QWEN_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "vocab_size": 152064,
           "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 32768}
QWEN_32B = {**QWEN_7B, "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
            "num_key_value_heads": 8, "intermediate_size": 27648}


@pytest.fixture
def models(tmp_path):
    out = {}
    for name, config in (("7b", QWEN_7B), ("32b", QWEN_32B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        out[name] = str(tmp_path / name)
    return out


def findings(code: str, model: str, *args: str, memory: int = 80 * GiB, rows: int | None = None,
             env: dict[str, str] | None = None) -> list:
    config = parse_command(["swift", "rlhf", "--rlhf_type", "grpo", "--model", model,
                            "--num_generations", "2", "--per_device_train_batch_size", "2",
                            *args], env or {"NPROC_PER_NODE": "8"})
    resources = Resources(8, memory, rows, "", model_info(config))
    return list(by_code(code)().check(Window(0.0, (), config=config, resources=resources)))


def test_model_size_from_config_json(models):
    config = parse_command(["swift", "rlhf", "--model", models["32b"]], {})
    info = model_info(config)
    assert round(info.params / 1e9, 1) == 32.8 and info.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert info.model_type == "qwen2"   # what a version clash may hang on (SD411)
    assert model_info(parse_command(["swift", "rlhf", "--model", "Qwen/Qwen2.5-7B"], {})) is None


def test_sd409_seed_002_32b_at_half_memory_without_tp(models):
    [f] = findings("SD409", models["32b"], "--use_vllm", "true", "--vllm_gpu_memory_utilization",
                   "0.5", "--vllm_max_model_len", "2048", "--offload_model", "true",
                   memory=96 * GiB)
    assert f.severity is Severity.ERROR and "the weights alone do not fit" in f.summary
    assert f.evidence["budget"] == 48 * GiB


def test_sd409_kv_cache_for_fewer_sequences_than_batched(models):
    [f] = findings("SD409", models["7b"], "--use_vllm", "true", "--vllm_gpu_memory_utilization",
                   "0.2", "--vllm_max_num_seqs", "8", "--offload_model", "true")
    assert f.severity is Severity.WARNING and f.evidence["sequences_that_fit"] == 1
    assert "fewer than the 8 vLLM will batch" in f.summary


def test_sd409_colocated_training_share(models):
    [f] = findings("SD409", models["7b"], "--use_vllm", "true", "--vllm_gpu_memory_utilization",
                   "0.6", "--vllm_max_model_len", "4096")
    assert f.severity is Severity.WARNING and f.summary.startswith("colocated: training needs")
    assert findings("SD409", models["7b"], "--use_vllm", "true", "--vllm_gpu_memory_utilization",
                    "0.6", "--vllm_max_model_len", "4096", "--deepspeed", "zero3") == []


def test_sd409_good_budget(models):
    assert findings("SD409", models["7b"], "--use_vllm", "true", "--vllm_gpu_memory_utilization",
                    "0.6", "--vllm_max_model_len", "4096", "--offload_model", "true") == []


def test_sd410_full_fine_tuning_without_limit(models):
    [f] = findings("SD410", models["7b"], "--tuner_type", "full", "--num_train_epochs", "1",
                   "--save_steps", "100", rows=8000)
    assert f.evidence["weights_bytes"] == model_info(
        parse_command(["swift", "rlhf", "--model", models["7b"]], {})).weight_bytes
    assert f.evidence["checkpoints"] == 10          # 1000 steps / 100
    assert "one checkpoint 14.2 GiB weights + 85.1 GiB optimizer state" in f.summary


def test_sd410_good(models):
    assert findings("SD410", models["7b"], "--tuner_type", "full", "--save_total_limit", "2") == []
    assert findings("SD410", models["7b"]) == []                       # LoRA by default
    assert findings("SD410", models["7b"], "--train_type", "full", "--save_strategy", "no") == []


@pytest.mark.parametrize("doc,why", [
    ([1, 2], "the top level is a list, not an object"),
    ({**QWEN_7B, "hidden_size": "big"}, 'hidden_size is "big", not a whole number from 1 to '
                                        '1000000'),
    ({**QWEN_7B, "num_attention_heads": 0}, "num_attention_heads is 0, not a whole number from 1 "
                                            "to 100000"),
    ({**QWEN_7B, "num_hidden_layers": True}, "num_hidden_layers is true, not a whole number "
                                             "from 1 to 100000"),
    ({**QWEN_7B, "vocab_size": 1e400}, "vocab_size is Infinity, not a whole number from 1 to "
                                       "100000000"),
    ({**QWEN_7B, "num_key_value_heads": [4]}, "num_key_value_heads is [4], not a whole number "
                                              "from 1 to 100000"),
    ({"text_config": "qwen"}, "text_config is a string, not an object"),
])
def test_config_json_of_the_wrong_shape_leaves_the_model_unknown_with_the_reason(tmp_path, doc,
                                                                                  why):
    (tmp_path / "config.json").write_text(json.dumps(doc))
    model, note = read_model(parse_command(["swift", "rlhf", "--model", str(tmp_path)], {}))
    assert model is None and note == f"cannot read {tmp_path / 'config.json'}: {why}"


@pytest.mark.timeout(20)
def test_config_json_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    model, note = read_model(parse_command(["swift", "rlhf", "--model", str(tmp_path)], {}))
    assert model is None and note.endswith("config.json: a FIFO, not a regular file")


def test_multimodal_config_reads_its_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": QWEN_7B}))
    model, note = read_model(parse_command(["swift", "rlhf", "--model", str(tmp_path)], {}))
    assert round(model.params / 1e9, 1) == 7.6 and note.startswith("read from ")


def test_sd410_a_limit_of_zero_is_no_limit_and_save_steps_below_one_is_a_share(models):
    [f] = findings("SD410", models["7b"], "--tuner_type", "full", "--save_total_limit", "0",
                   "--num_train_epochs", "1", "--save_steps", "0.25", rows=8000)
    assert f.evidence["checkpoints"] == 4 and f.evidence["save_steps"] == 0.25
