from __future__ import annotations

import json

import pytest

from stalldoc.launch.config import parse_command, parse_flags

GRPO = ["--rlhf_type", "grpo", "--model", "Qwen/Qwen2.5-32B", "--use_vllm", "true",
        "--tensor_parallel_size", "4", "--reward_funcs", "accuracy", "format",
        "--offload_model", "--deepspeed=zero3_offload"]


def test_flags_values_lists_bare_and_equals_with_3x_names_mapped():
    args = parse_flags(GRPO)
    assert args["reward_funcs"] == ("accuracy", "format")
    assert args["vllm_tensor_parallel_size"] == ("4",) and "tensor_parallel_size" not in args
    assert args["offload_model"] == () and args["deepspeed"] == ("zero3_offload",)


@pytest.mark.parametrize("argv,env,launcher,nproc,nnodes", [
    (["swift", "rlhf", *GRPO], {"NPROC_PER_NODE": "8", "NNODES": "2"}, "swift", 8, 2),
    (["torchrun", "--nproc_per_node", "4", "--master_port", "29500",
      "/venv/lib/python3.11/site-packages/swift/cli/rlhf.py", *GRPO], {}, "torchrun", 4, None),
    (["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "--nnodes", "3", "-m",
      "swift.cli.rlhf", *GRPO], {}, "torchrun", 2, 3),
    (["/usr/bin/python", "-u", "-m", "swift.cli.rlhf", *GRPO], {}, "python", None, None),
    (["deepspeed", "--num_gpus", "8", "swift/cli/rlhf.py", *GRPO], {}, "deepspeed", 8, None),
    (["accelerate", "launch", "--num_processes", "6", "swift/cli/rlhf.py", *GRPO], {},
     "accelerate", 6, None),
])
def test_swift_grpo_under_every_launcher(argv, env, launcher, nproc, nnodes):
    config = parse_command(argv, env)
    assert (config.launcher, config.nproc_per_node, config.nnodes) == (launcher, nproc, nnodes)
    assert config.swift_command == "rlhf" and config.is_grpo
    assert config.flag("use_vllm") and config.flag("offload_model")
    assert config.number("vllm_tensor_parallel_size") == 4
    assert config.value("deepspeed") == "zero3_offload"


def test_not_swift_and_bad_numbers_stay_quiet():
    config = parse_command(["python", "train.py", "--lr", "x"], {"NPROC_PER_NODE": "eight"})
    assert (config.launcher, config.program, config.swift_command) == ("python", "train.py", None)
    assert config.nproc_per_node is None and config.number("lr") is None and not config.is_grpo
    assert config.world_size is None
    assert parse_command([], {}).launcher == "other"


def test_swift_config_file_form(tmp_path):
    config_file = tmp_path / "grpo.json"
    config_file.write_text(json.dumps({
        "rlhf_type": "grpo", "num_generations": 4, "reward_funcs": ["accuracy", "format"],
        "use_vllm": True, "ENV": {"NPROC_PER_NODE": "4", "NNODES": "2"}}))
    config = parse_command(["swift", "rlhf", str(config_file), "--num_generations", "8"],
                           {"NNODES": "1"})
    assert config.is_grpo and config.args["reward_funcs"] == ("accuracy", "format")
    assert config.number("num_generations") == 8          # the command line comes after the file
    assert config.flag("use_vllm")
    assert (config.nproc_per_node, config.nnodes) == (4, 1)  # the environment wins over ENV


def test_swift_yaml_config_and_unreadable_file(tmp_path):
    yaml_file = tmp_path / "grpo.yaml"
    yaml_file.write_text("rlhf_type: grpo\nper_device_train_batch_size: 3\n")
    config = parse_command(["swift", "rlhf", str(yaml_file)], {})
    assert config.is_grpo and config.number("per_device_train_batch_size") == 3
    missing = parse_command(["swift", "rlhf", str(tmp_path / "nope.yaml")], {})
    assert missing.error.startswith("cannot read") and not missing.is_grpo
