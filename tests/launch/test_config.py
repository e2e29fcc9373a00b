from __future__ import annotations

import json
import os
import socket

import pytest

from stalldoc.launch.arguments import BadArgument
from stalldoc.launch.config import deepspeed_of, number, parse_command, parse_flags
from stalldoc.launch.resources import read_model

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
    assert number(config, "vllm_tensor_parallel_size") == 4
    assert config.value("deepspeed") == "zero3_offload"


def test_not_swift_and_bad_numbers_stay_quiet():
    config = parse_command(["python", "train.py", "--lr", "x"], {"NPROC_PER_NODE": "eight"})
    assert (config.launcher, config.program, config.swift_command) == ("python", "train.py", None)
    assert config.nproc_per_node is None and number(config, "lr") is None and not config.is_grpo
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
    assert number(config, "num_generations") == 8          # the command line comes after the file
    assert config.flag("use_vllm")
    assert (config.nproc_per_node, config.nnodes) == (4, 1)  # the environment wins over ENV


def test_swift_yaml_config_and_unreadable_file(tmp_path):
    yaml_file = tmp_path / "grpo.yaml"
    yaml_file.write_text("rlhf_type: grpo\nper_device_train_batch_size: 3\n")
    config = parse_command(["swift", "rlhf", str(yaml_file)], {})
    assert config.is_grpo and number(config, "per_device_train_batch_size") == 3
    missing = parse_command(["swift", "rlhf", str(tmp_path / "nope.yaml")], {})
    assert missing.error.startswith("cannot read") and not missing.is_grpo


# ----- numbers: one place, swift's ranges, one line ------------------------------------------
GRPO_HEAD = ["swift", "rlhf", "--rlhf_type", "grpo"]


@pytest.mark.parametrize("flag,value,why", [
    ("num_generations", "0", "must be a whole number from 1 to 1000000"),
    ("per_device_train_batch_size", "-1", "must be a whole number from 1 to 1000000"),
    ("per_device_train_batch_size", "1e11", "must be a whole number from 1 to 1000000"),
    ("per_device_train_batch_size", str(10**30), "must be a whole number from 1 to 1000000"),
    ("gradient_accumulation_steps", "nan", "must be a whole number from 1 to 1000000"),
    ("num_generations", "8.0", "must be a whole number from 1 to 1000000"),   # swift: int()
    ("num_train_epochs", "inf", "must be a finite number > 0, at most 1000000"),
    ("num_train_epochs", "0", "must be a finite number > 0, at most 1000000"),
    ("split_dataset_ratio", "2", "must be a fraction in [0, 1]"),
    ("vllm_gpu_memory_utilization", "0", "must be a fraction in (0, 1]"),
    ("vllm_tensor_parallel_size", "0", "must be a whole number from 1 to 1024"),
    ("sleep_level", "3", "must be a whole number from 0 to 2"),
    ("max_steps", "-inf", "must be a whole number from -1 to 1000000000"),
])
def test_a_number_out_of_range_is_one_line_and_raises_only_when_used(flag, value, why):
    config = parse_command([*GRPO_HEAD, f"--{flag}", value], {})
    assert config.error == f"--{flag} {value}: {why}"
    with pytest.raises(BadArgument, match=f"^--{flag} "):
        number(config, flag)


def test_hostile_values_are_quoted_and_cut_so_the_message_stays_one_line():
    config = parse_command([*GRPO_HEAD, "--num_generations", "x\ny" * 50, "--num_iterations", "",
                            "--max_length"], {})
    problems = config.error.split("; ")
    assert problems[0].startswith("--num_generations 'x\\nyx\\ny") and "..." in problems[0]
    assert problems[1] == "--num_iterations '': must be a whole number from 1 to 1000000"
    assert problems[2] == "--max_length: needs a value, a whole number from 1 to 100000000"
    assert "\n" not in config.error


def test_good_numbers_read_as_swift_reads_them():
    config = parse_command([*GRPO_HEAD, "--num_generations", " 4 ", "--num_train_epochs", "0.5",
                            "--max_steps", "-1", "--save_total_limit", "0",
                            "--vllm_gpu_memory_utilization", "1"], {})
    assert config.error == ""
    assert number(config, "num_generations") == 4 and number(config, "num_train_epochs") == 0.5
    assert number(config, "max_steps") == -1 and number(config, "save_total_limit") == 0
    assert number(config, "lr") is None
    assert number(parse_command(["swift", "rlhf", "--lr", "inf"], {}), "lr") is None


def test_a_training_script_of_its_own_is_not_held_to_swifts_numbers():
    assert parse_command(["python", "train.py", "--num_generations", "0"], {}).error == ""


@pytest.mark.parametrize("argv,env,error", [
    (["swift", "rlhf"], {"NPROC_PER_NODE": "0"},
     "NPROC_PER_NODE 0: must be a whole number from 1 to 1024"),
    (["swift", "rlhf"], {"NPROC_PER_NODE": "100000000000"},
     "NPROC_PER_NODE 100000000000: must be a whole number from 1 to 1024"),
    (["swift", "rlhf"], {"NPROC_PER_NODE": "eight"},
     "NPROC_PER_NODE eight: must be a whole number from 1 to 1024"),
    (["swift", "rlhf"], {"NPROC_PER_NODE": "8", "NNODES": "-2"},
     "NNODES -2: must be a whole number from 1 to 100000"),
    (["torchrun", "--nproc_per_node", "0", "train.py"], {},
     "--nproc_per_node 0: must be a whole number from 1 to 1024"),
    (["python", "-m", "swift.cli.rlhf"], {"NPROC_PER_NODE": "-3"},
     "NPROC_PER_NODE -3: must be a whole number from 1 to 1024"),
])
def test_processes_and_nodes_out_of_range(argv, env, error):
    config = parse_command(argv, env)
    assert config.error == error
    assert None in (config.nproc_per_node, config.nnodes)     # the bad one is not used


def test_torchrun_words_for_the_processes_are_not_errors():
    config = parse_command(["torchrun", "--nproc_per_node", "gpu", "train.py"], {})
    assert config.error == "" and config.nproc_per_node is None
    assert parse_command(["swift", "rlhf"], {"NPROC_PER_NODE": "auto"}).error == ""


# ----- config files: never blocking, capped, their shape said in one line ----------------------
def error_of(path) -> str:
    config = parse_command(["swift", "rlhf", str(path)], {})
    assert "\n" not in config.error
    return config.error


@pytest.mark.parametrize("name,text,why", [
    ("list.yaml", "- a\n- b\n", "the top level is a list, not a mapping of argument names"),
    ("scalar.yaml", "hello\n", "the top level is a string, not a mapping of argument names"),
    ("list.json", "[1, 2]", "the top level is a list, not a mapping of argument names"),
    ("env.yaml", "ENV: [1, 2]\n", "ENV is a list, not a mapping of variable names to values"),
    ("env2.yaml", "ENV: hello\n", "ENV is a string, not a mapping of variable names to values"),
    ("bad.yaml", "a: [1\n", "not valid YAML: expected ',' or ']', but got '<stream end>' at "
                            "line 2, column 1"),
    ("tag.yaml", "!!python/object:os.system {}\n", "not valid YAML: could not determine a "
     "constructor for the tag 'tag:yaml.org,2002:python/object:os.system' at line 1, column 1"),
    ("bad.json", '{"a":', "Expecting value: line 1 column 6 (char 5)"),
    ("deep.json", "[" * 5000 + "]" * 5000, "maximum recursion depth exceeded while decoding a "
                                           "JSON array from a unicode string"),
    ("deep.yaml", "[" * 5000 + "]" * 5000, "maximum recursion depth exceeded"),
    ("cycle.yaml", "a: &a [*a]\n", "more than 100000 values or nested deeper than 64 levels"),
    ("date.yaml", "x: {a: 2024-01-01}\n", "Object of type date is not JSON serializable"),
])
def test_config_file_shapes_swift_cannot_use(tmp_path, name, text, why):
    (tmp_path / name).write_text(text)
    assert error_of(tmp_path / name) == f"cannot read {tmp_path / name}: {why}"


@pytest.mark.timeout(20)
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    assert error_of(tmp_path / "bomb.yaml").endswith(
        "more than 100000 values or nested deeper than 64 levels")


def test_undecodable_and_too_large_config_files(tmp_path):
    (tmp_path / "bytes.yaml").write_bytes(b"\xff\xfe\x00rlhf_type: grpo")
    assert "can't decode byte 0xff in position 0" in error_of(tmp_path / "bytes.yaml")
    with open(tmp_path / "big.yaml", "wb") as fh:
        fh.truncate(2 << 30)                      # 2 GB, sparse
    assert error_of(tmp_path / "big.yaml").endswith(
        "larger than 128 KiB, too large for a configuration file")


@pytest.mark.timeout(20)
def test_fifo_device_directory_and_socket_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "dir.yaml").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock.yaml"))
        for name, kind in (("fifo.yaml", "a FIFO"), ("zero.json", "a character device"),
                           ("dir.yaml", "a directory"), ("sock.yaml", "a socket")):
            assert error_of(tmp_path / name) == \
                f"cannot read {tmp_path / name}: {kind}, not a regular file"


def test_env_block_values_are_checked_like_the_environment(tmp_path):
    (tmp_path / "c.yaml").write_text("rlhf_type: grpo\nnum_generations: .nan\n"
                                     "ENV: {NPROC_PER_NODE: 0}\n")
    assert error_of(tmp_path / "c.yaml") == (
        "NPROC_PER_NODE 0: must be a whole number from 1 to 1024; --num_generations nan: must "
        "be a whole number from 1 to 1000000")


# ----- DeepSpeed JSON of the wrong shape ------------------------------------------------------
@pytest.mark.parametrize("doc,why", [
    ([1], "the top level is a list, not an object"),
    ({"zero_optimization": "zero3"}, "zero_optimization is a string, not an object"),
    ({"zero_optimization": [3]}, "zero_optimization is a list, not an object"),
    ({"zero_optimization": {"stage": "three"}}, 'zero_optimization.stage is "three", not 0, 1, '
                                                '2 or 3'),
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage is true, not 0, 1, 2 or 3"),
    ({"zero_optimization": {"stage": 7}}, "zero_optimization.stage is 7, not 0, 1, 2 or 3"),
    ({"zero_optimization": {"stage": 3, "offload_param": "cpu"}},
     "zero_optimization.offload_param is a string, not an object"),
])
def test_deepspeed_json_of_the_wrong_shape(tmp_path, doc, why):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(doc))
    config = parse_command([*GRPO_HEAD, "--deepspeed", str(ds)], {})
    assert config.error == f"cannot read {ds}: {why}"
    assert deepspeed_of(config).stage is None


@pytest.mark.timeout(20)
def test_deepspeed_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "ds.json")
    config = parse_command([*GRPO_HEAD, "--deepspeed", str(tmp_path / "ds.json")], {})
    assert config.error == f"cannot read {tmp_path / 'ds.json'}: a FIFO, not a regular file"
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": "3", "offload_param":
                                                      {"device": "CPU"}}}))
    choice = deepspeed_of(parse_command([*GRPO_HEAD, "--deepspeed", str(good)], {}))
    assert (choice.stage, choice.offload_param, choice.error) == (3, True, "")


def test_a_deepspeed_path_with_a_line_break_is_said_on_one_line(tmp_path):
    # the fuzzer's find (tests/check/test_check_fuzz.py): --deepspeed 'x<newline>y'
    config = parse_command([*GRPO_HEAD, "--deepspeed", "x\ny"], {})
    assert config.error == "cannot read x\\ny: No such file or directory", config.error
    # and a --model of that kind, in the note of what could not be read
    model = parse_command([*GRPO_HEAD, "--model", "Qwen/x\ny"], {})
    assert read_model(model) == (None, "Qwen/x\\ny is not a local directory")
