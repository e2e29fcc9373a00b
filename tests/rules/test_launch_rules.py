"""SD4xx before launch: good / bad swift GRPO command lines, including seed 002's 32B
configuration (zero3_offload + offload_model, tensor_parallel_size 8 x num_infer_workers 8,
async_generate, vllm_max_model_len 2048) on an 8-GPU node."""
from __future__ import annotations

import json

import pytest

from stalldoc.launch.arguments import BadArgument
from stalldoc.launch.config import deepspeed_of, parse_command
from stalldoc.model.findings import Severity
from stalldoc.model.launch import ModelInfo, Resources
from stalldoc.model.window import Window
from stalldoc.rules import run_rules
from stalldoc.rules.config_helpers import DIVISORS_SHOWN, divisors, listing

SEED_002 = ["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-32B-Instruct",
            "--use_vllm", "true", "--vllm_gpu_memory_utilization", "0.5",
            "--vllm_max_model_len", "2048", "--max_completion_length", "2048",
            "--tensor_parallel_size", "8", "--num_infer_workers", "8", "--async_generate", "true",
            "--offload_model", "true", "--offload_optimizer", "true",
            "--deepspeed", "zero3_offload", "--num_generations", "8"]
GOOD = ["swift", "rlhf", "--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_tensor_parallel_size", "2",
        "--vllm_max_model_len", "4096", "--max_length", "2048", "--max_completion_length", "1024",
        "--deepspeed", "zero3", "--offload_model", "true", "--num_generations", "8"]
EIGHT = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NPROC_PER_NODE": "8"}


def launch_findings(argv: list[str], env: dict[str, str]) -> dict[str, list]:
    window = Window(0.0, (), config=parse_command(argv, env))
    out: dict[str, list] = {}
    for finding in run_rules(window, "launch"):
        out.setdefault(finding.code, []).append(finding)
    return out


def test_seed_002_configuration():
    found = launch_findings(SEED_002, EIGHT)
    assert set(found) == {"SD401", "SD402", "SD403", "SD405"}
    [length] = found["SD401"]
    assert length.severity is Severity.ERROR and "2048 >= vllm_max_model_len 2048" in length.summary
    [layout] = found["SD402"]
    assert "num_infer_workers 8 x vllm_tensor_parallel_size 8 = 64 engine shards on 8 GPUs" in \
        layout.summary
    assert found["SD403"][0].evidence["vllm_mode"] == "colocate (default)"
    assert "offload_model and offload_optimizer with --deepspeed zero3_offload (ZeRO-3 offload)" \
        in found["SD405"][0].summary


def test_a_sound_configuration_has_no_launch_findings():
    assert launch_findings(GOOD, EIGHT) == {}


def test_prompt_plus_completion_over_model_len_is_a_warning():
    argv = GOOD[:GOOD.index("--max_length")] + ["--max_length", "3500",
                                                 "--max_completion_length", "1024"]
    [finding] = launch_findings(argv, EIGHT)["SD401"]
    assert finding.severity is Severity.WARNING and finding.evidence["needed"] == 4524


def test_tp_must_divide_the_world_size_with_swifts_words():
    argv = [*GOOD[:GOOD.index("--vllm_tensor_parallel_size")], "--vllm_tensor_parallel_size", "4"]
    [finding] = launch_findings(argv, {"NPROC_PER_NODE": "6"})["SD402"]
    assert finding.summary.startswith("vllm_tensor_parallel_size (4) must divide world size (6)")
    assert finding.evidence["valid"] == [1, 2, 3, 6]


def test_processes_against_gpus():
    more = launch_findings(GOOD, {"NPROC_PER_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert "8 processes per node for 4 GPUs" in more["SD404"][0].summary
    uneven = launch_findings(GOOD, {"NPROC_PER_NODE": "3", **{"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}})
    assert uneven["SD404"][0].summary.startswith("n_gpu: 8, local_world_size: 3")
    fewer = launch_findings(GOOD, {"NPROC_PER_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    [idle] = fewer["SD404"]
    assert idle.severity is Severity.WARNING and "4 GPUs idle" in idle.summary


def test_not_swift_nothing_to_say():
    assert launch_findings(["torchrun", "--nproc_per_node", "2", "train.py"], {}) == {}


def test_deepspeed_json_offload_counts_like_the_preset(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer":
                                                    {"device": "cpu", "pin_memory": True}}}))
    argv = [*GOOD[:GOOD.index("--deepspeed")], "--deepspeed", str(ds), "--offload_model", "true"]
    [finding] = launch_findings(argv, EIGHT)["SD405"]
    assert finding.evidence["stage"] == 3 and finding.evidence["ds_offload_optimizer"]
    assert not finding.evidence["ds_offload_param"]
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert "SD405" not in launch_findings(argv, EIGHT)


def test_unreadable_deepspeed_json_is_said_not_raised(tmp_path):
    config = parse_command(["swift", "rlhf", "--deepspeed", str(tmp_path / "missing.json")], {})
    choice = deepspeed_of(config)
    assert choice.stage is None and choice.error.startswith("cannot read")


# ----- valid values listed in bounded time ----------------------------------------------------
@pytest.mark.parametrize("start", [1, 2])
def test_divisors_agree_with_brute_force(start):
    for n in range(1, 3000):
        every = [d for d in range(start, n + 1) if n % d == 0]
        assert divisors(n, start) == (every[:DIVISORS_SHOWN], len(every) <= DIVISORS_SHOWN), n


@pytest.mark.timeout(10)
def test_divisors_of_huge_numbers_are_quick_and_say_they_are_not_all():
    assert divisors(10**30, 2) == ([2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 125, 128,
                                    160, 200, 250, 256, 320, 400, 500, 512], False)
    prime = 1_000_000_000_039                # no divisor up to the trial limit (10**5)
    assert divisors(prime) == ([1], False)
    assert listing([1], False) == "[1, ...]" and listing([2, 3], True) == "[2, 3]"


@pytest.mark.timeout(20)
def test_sd406_with_the_largest_batch_lists_a_bounded_prefix():
    argv = ["swift", "rlhf", "--rlhf_type", "grpo", "--per_device_train_batch_size", "1000000",
            "--steps_per_generation", "1000000", "--num_generations", "7"]
    [finding] = launch_findings(argv, {"NPROC_PER_NODE": "1024", "NNODES": "100000"})["SD406"]
    gbs = 10**6 * 1024 * 100000 * 10**6
    assert finding.summary.startswith(f"generation_batch_size ({gbs}) must be evenly divisible "
                                      "by num_generations (7). Valid values: [2, 4, 5, 8,")
    assert finding.summary.endswith(", ...].") and not finding.evidence["valid_complete"]
    assert len(finding.evidence["valid"]) == DIVISORS_SHOWN


@pytest.mark.timeout(20)
def test_sd402_and_sd408_with_huge_worlds_are_quick():
    argv = [*GOOD[:GOOD.index("--vllm_tensor_parallel_size")], "--vllm_tensor_parallel_size",
            "7", "--per_device_eval_batch_size", "1000000", "--num_generations_eval", "7",
            "--split_dataset_ratio", "0.1"]
    found = launch_findings(argv, {"NPROC_PER_NODE": "1000", "NNODES": "99999"})
    assert "valid: [1, 2, 3, 4, 5, 6, 8, 9, 10," in found["SD402"][0].summary
    assert found["SD408"][0].summary.endswith(", ...].")


def test_a_rule_given_a_number_out_of_range_says_which_not_a_zero_division():
    argv = ["swift", "rlhf", "--rlhf_type", "grpo", "--num_generations", "0"]
    with pytest.raises(BadArgument, match="^--num_generations 0: must be a whole number"):
        launch_findings(argv, EIGHT)


def versioned_findings(argv: list[str], env: dict[str, str], versions: dict[str, str],
                       model_type: str = "") -> dict[str, list]:
    """The launch findings with the frameworks of the command's interpreter known."""
    model = ModelInfo(7_000_000_000, 28, 4, 128, 32768, 2, model_type) if model_type else None
    window = Window(0.0, (), config=parse_command(argv, env),
                    resources=Resources(versions=versions, versions_note="python3 (test)",
                                        model=model))
    out: dict[str, list] = {}
    for finding in run_rules(window, "launch"):
        out.setdefault(finding.code, []).append(finding)
    return out


ASYNC = SEED_002[:SEED_002.index("--tensor_parallel_size")] + [
    "--async_generate", "true", "--num_generations", "8"]


@pytest.mark.parametrize("swift,env,workers,mode", [
    # 3.2.0: vLLM always on GPUs of its own (7 training processes, vLLM on cuda:7)
    ("3.2.0", {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NPROC_PER_NODE": "7"}, "1",
     None),
    # 3.4.1: one inference worker on the last of 4 GPUs, 3 training (ms-swift#3794's layout)
    ("3.4.1", {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "NPROC_PER_NODE": "3"}, "1", None),
    # 3.4.1: num_infer_workers = the GPUs: swift's own test for its colocate mode
    ("3.4.1", EIGHT, "8", "colocate (ms-swift 3.4.1: num_infer_workers 8 = the 8 GPUs the job "
                          "sees)"),
    # 3.5.0 and later: no vllm_mode is colocate
    ("3.5.0", EIGHT, "1", "colocate (default)"),
])
def test_async_generate_is_colocated_as_the_installed_swift_places_vllm(swift, env, workers,
                                                                        mode):
    found = versioned_findings(ASYNC + ["--num_infer_workers", workers], env,
                               {"ms-swift": swift, "vllm": "0.7.3"})
    if mode is None:
        assert "SD403" not in found, found.get("SD403")
    else:
        assert found["SD403"][0].evidence["vllm_mode"] == mode


def test_async_generate_on_swift_3_4_with_gpus_unknown_is_not_called_colocated():
    found = versioned_findings(ASYNC, {"NPROC_PER_NODE": "3"}, {"ms-swift": "3.4.1"})
    assert "SD403" not in found


def test_a_known_clash_is_named_with_its_thread_and_fix():
    # ms-swift 3.4.1's async mode on vLLM 0.8.5: C01 (maintainers' README: may hang)
    found = versioned_findings(ASYNC + ["--num_infer_workers", "1"],
                               {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "NPROC_PER_NODE": "3"},
                               {"ms-swift": "3.4.1", "vllm": "0.8.5.post1"})
    [clash] = found["SD411"]
    assert clash.severity is Severity.WARNING
    assert clash.summary.startswith("1 known version clash: C01 ms-swift 3.4.1 + vllm "
                                    "0.8.5.post1 with --async_generate: ")
    assert "https://github.com/modelscope/ms-swift/pull/4204" in clash.summary
    [row] = clash.evidence["clashes"]
    assert row["ranges"] == ["ms-swift >=3.2.1,<3.5", "vllm >=0.8"]
    assert clash.evidence["versions_from"] == "python3 (test)"
    assert clash.fix.startswith("vllm==0.7.3, or ms-swift>=3.5")


def test_a_clash_whose_bound_was_inferred_is_information():
    found = versioned_findings(["swift", "rollout", "--model", "Qwen/Qwen2.5-7B-Instruct"], {},
                               {"ms-swift": "3.5.0.dev0", "vllm": "0.8.3", "trl": "0.16.1"})
    [clash] = found["SD411"]
    assert clash.severity is Severity.INFO and clash.evidence["clashes"][0]["row"] == "C04"


def test_no_clash_without_the_versions():
    assert "SD411" not in versioned_findings(ASYNC, EIGHT, {})
