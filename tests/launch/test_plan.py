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
