from __future__ import annotations

import math

import pytest

from stalldoc.launch.arguments import BadArgument
from stalldoc.launch.config import parse_command
from stalldoc.launch.plan import grpo_plan


def grpo(*args: str, env: dict[str, str] | None = None):
    return parse_command(["swift", "rlhf", "--rlhf_type", "grpo", *args], env or {})


def test_the_seed_worked_example_gives_1320():
    # seed 003: 8000 prompts, 1 % held out, G=8, B=8, 6 ranks, GA=2, I=2, one epoch
    config = grpo("--num_generations", "8", "--per_device_train_batch_size", "8",
                  "--gradient_accumulation_steps", "2", "--num_iterations", "2",
                  "--num_train_epochs", "1", "--split_dataset_ratio", "0.01",
                  env={"NPROC_PER_NODE": "6"})
    plan = grpo_plan(config, 8000)
    assert (plan.train_prompts, plan.generation_batch_size, plan.rollouts_per_epoch) == (7920, 96, 660)
    assert plan.max_steps == 1320 and not plan.max_steps_given
    assert plan.arithmetic[-1] == "max_steps = ceil(E * steps per epoch) = ceil(1*1320) = 1320"


def test_defaults_and_generation_batch_size_given():
    plan = grpo_plan(grpo("--generation_batch_size", "32", env={"NPROC_PER_NODE": "4"}), 100)
    assert (plan.per_device_train_batch_size, plan.steps_per_generation) == (1, 8)
    assert plan.prompts_per_generation == 4 and plan.num_train_epochs == 3.0
    assert plan.max_steps == 3 * (100 * 8 // 32) * 8


def test_max_steps_given_wins_and_unknown_world_has_no_plan():
    assert grpo_plan(grpo("--max_steps", "50"), None).max_steps == 50
    torchrun = parse_command(["torchrun", "-m", "swift.cli.rlhf", "--rlhf_type", "grpo"], {})
    assert grpo_plan(torchrun, 10) is None
    assert grpo_plan(parse_command(["python", "train.py"], {}), 10) is None


@pytest.mark.parametrize("flag,value", [
    ("num_generations", "0"), ("per_device_train_batch_size", "0"), ("num_train_epochs", "inf"),
    ("num_train_epochs", "nan"), ("gradient_accumulation_steps", "0"), ("max_steps", "inf"),
    ("generation_batch_size", "1e11"), ("split_dataset_ratio", "2"), ("num_iterations", "-1"),
])
def test_a_number_out_of_range_is_a_bad_argument_not_a_crash(flag, value):
    config = grpo(f"--{flag}", value)
    assert config.error.startswith(f"--{flag} {value}: must be ")
    with pytest.raises(BadArgument, match=f"^--{flag} {value}: must be "):
        grpo_plan(config, 100)


def test_the_largest_values_allowed_plan_finitely():
    config = grpo("--per_device_train_batch_size", "1000000", "--num_generations", "1000000",
                  "--gradient_accumulation_steps", "1000000", "--num_iterations", "1000000",
                  "--num_train_epochs", "1000000", env={"NPROC_PER_NODE": "1024",
                                                        "NNODES": "100000"})
    assert config.error == ""
    plan = grpo_plan(config, 10**12)
    assert plan.generation_batch_size == 10**6 * 1024 * 100000 * 10**6 and plan.max_steps == 0
    many = grpo_plan(grpo("--num_generations", "1000000", "--gradient_accumulation_steps",
                          "1000000", "--num_iterations", "1000000", "--num_train_epochs",
                          "1000000"), 10**12)
    assert math.isclose(many.max_steps, 10**24)          # E * R * I * S / GA, in floats as swift


def test_every_letter_is_defined_with_where_its_value_comes_from():
    config = grpo("--per_device_train_batch_size", "4", "--num_generations", "8")
    plan = grpo_plan(config, 100, "counted from x.jsonl")
    letters = {s.symbol: s for s in plan.symbols}
    assert list(letters) == ["B", "W", "GA", "S", "G", "I", "E", "N"]
    assert (letters["B"].value, letters["B"].source) == ("4", "")             # given
    assert (letters["GA"].value, letters["GA"].source) == ("1", "swift's default")
    assert letters["S"].source == "swift's default: GA"
    assert letters["W"].source == "NPROC_PER_NODE not set: swift runs one process"
    assert letters["N"].source == "the dataset's rows (counted from x.jsonl)"
    assert "per_device_train_batch_size" not in plan.defaults
    assert {"gradient_accumulation_steps", "num_iterations", "num_train_epochs"} <= set(
        plan.defaults)


def test_an_unknown_dataset_says_why_and_a_split_says_how_much():
    unknown = grpo_plan(grpo(), None, "x.jsonl is not a local file (give --dataset-size)")
    n = unknown.symbols[-1]
    assert (n.value, n.source) == ("unknown", "x.jsonl is not a local file (give --dataset-size)")
    split = grpo_plan(grpo("--split_dataset_ratio", "0.01"), 8000).symbols[-1]
    assert (split.value, split.source) == ("7920", "8000 rows, 1% held out (split_dataset_ratio)")


def test_counts_are_whole_and_singular_where_they_are_one():
    one = grpo_plan(grpo("--num_generations", "8"), None)      # B = W = S = 1
    assert one.arithmetic[0] == "global batch B*W = 1*1 = 1 completion"
    assert one.arithmetic[1] == ("generation batch Gb = B*W*S = 1*1*1 = 1 completion: not a whole "
                                 "number of prompts of G = 8 generations (see SD406)")
    whole = grpo_plan(grpo("--per_device_train_batch_size", "8", "--num_generations", "8"), None)
    assert whole.arithmetic[1].endswith("= 8 completions = 1 prompt x 8 generations")
    given = grpo_plan(grpo("--generation_batch_size", "32", env={"NPROC_PER_NODE": "4"}), None)
    assert given.arithmetic[1] == ("generation batch Gb = 32 completions (generation_batch_size) "
                                   "= 4 prompts x 8 generations")
    assert given.symbols[3].source == "generation_batch_size / (B*W)"
