"""Fuzzing `stalldoc check`'s parsers with Hypothesis: command lines that mix swift's real flag
names with hostile values, and config files (swift YAML / JSON, DeepSpeed JSON, model
config.json, datasets) of random structure or random bytes.

Properties: ``run_check`` returns or raises BadInput (a one-line message), never anything else,
and quickly; when it returns, no check failed or ran out of time. And, as watch runs them:
``parse_command`` never raises, ``launch_checks`` never raises, and whatever it skipped is
explained by what ``parse_command`` said in ``config.error``.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from stalldoc.check.preflight import BadInput, LaunchChecks, launch_checks, run_check
from stalldoc.launch.arguments import SWIFT_NUMBERS
from stalldoc.launch.config import parse_command

QUICK_S = 5.0     # a check that takes longer than this has hung on something
BUDGET_S = 30.0   # so the budget never decides an outcome here: a timeout is a failure
FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

FLAGS = sorted(SWIFT_NUMBERS) + [
    "rlhf_type", "use_vllm", "vllm_mode", "async_generate", "offload_model", "offload_optimizer",
    "deepspeed", "model", "dataset", "tuner_type", "train_type", "tensor_parallel_size",
    "teacher_model", "val_dataset", "eval_strategy", "save_strategy", "save_only_model",
    "torch_dtype", "nproc_per_node", "nnodes"]
HOSTILE = ["0", "-1", "1", "2", "3", "7", "8", "64", "0.5", "1.0", "nan", "-nan", "inf", "-inf",
           "1e11", "1e308", "1e400", str(10**11), str(10**30), "9" * 5000, "", " ", "garbage",
           "ünïcödé", "٣", "²", "None", "true", "false", "grpo", "zero3", "zero3_offload",
           "colocate", "server", "full", "lora", "\x00", "a\x00b", "-", "x\ny", "/dev/zero",
           "/dev/null", "/dev/stdin", "/proc/self/status", "/", ".", "data.jsonl#5",
           "data.jsonl#²", "auto", "gpu", "1024", "1025", "100000", "1000000", "1000001",
           "100000000", "1000000000"]
values = st.one_of(st.sampled_from(HOSTILE), st.integers(-10**40, 10**40).map(str),
                   st.integers(0, 2 * 10**6).map(str), st.floats().map(str),
                   st.text(max_size=12))


def in_range(flag: str) -> st.SearchStrategy[str]:
    """Values swift accepts for a numeric flag, so the checks behind the parser run too."""
    spec = SWIFT_NUMBERS.get(flag)
    if spec is None:
        return st.nothing()
    if spec.whole:
        low, high = int(spec.low), int(spec.high)
        return st.one_of(st.integers(low, high), st.sampled_from([low, high, high - 1]),
                         st.integers(max(low, high // 1000), high)).map(str)
    return st.floats(spec.low, spec.high, exclude_min=spec.low_open).map(repr)


def flag_values(flag: str) -> st.SearchStrategy[tuple[str, list[str]]]:
    one = st.one_of(in_range(flag), values)
    return st.tuples(st.just(flag), one.map(lambda v: [v]) | st.lists(one, max_size=2))


flag_groups = st.lists(st.sampled_from(FLAGS).flatmap(flag_values), max_size=10)
environments = st.dictionaries(st.sampled_from(["NPROC_PER_NODE", "NNODES",
                                                "CUDA_VISIBLE_DEVICES"]),
                               st.integers(1, 1024).map(str) | st.sampled_from(HOSTILE)
                               | st.text(max_size=6), max_size=3)
launchers = st.sampled_from([["swift", "rlhf"], ["torchrun", "--nproc_per_node", "4", "-m",
                                                 "swift.cli.rlhf"],
                             ["python", "-m", "swift.cli.rlhf"], ["swift", "sft"]])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(),
                    st.text(max_size=10), st.sampled_from(HOSTILE))
documents = st.recursive(
    scalars, lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(FLAGS + ["ENV", "zero_optimization", "stage"])
                      | st.text(max_size=6), children, max_size=4), max_leaves=25)
swift_configs = st.one_of(documents, st.dictionaries(st.sampled_from(FLAGS + ["ENV"]), documents,
                                                     max_size=8))
MODEL_FIELDS = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                "max_position_embeddings": 1024, "torch_dtype": "bfloat16"}
model_configs = st.one_of(documents, st.dictionaries(st.sampled_from(sorted(MODEL_FIELDS) + [
    "head_dim", "num_experts", "moe_intermediate_size", "text_config", "tie_word_embeddings"]),
    scalars, max_size=5).map(lambda bad: {**MODEL_FIELDS, **bad}))
deepspeed_configs = st.one_of(documents, st.fixed_dictionaries({"zero_optimization": st.one_of(
    documents, st.fixed_dictionaries({}, optional={"stage": scalars, "offload_param": documents,
                                                   "offload_optimizer": documents}))}))


def flatten(groups: list[tuple[str, list[str]]]) -> list[str]:
    return [arg for flag, vals in groups for arg in (f"--{flag}", *vals)]


def checked(argv: list[str], env: dict[str, str], gpus: int | None = None,
            memory: int | None = None) -> LaunchChecks | None:
    """run_check's outcome, asserting the properties: BadInput in one line, or no check failed
    or timed out; quick either way."""
    started = time.monotonic()
    keys = ("NPROC_PER_NODE", "NNODES", "CUDA_VISIBLE_DEVICES")
    with mock.patch.dict(os.environ, {}), mock.patch("stalldoc.check.preflight._node_gpus", lambda: []):
        for key in keys:
            os.environ.pop(key, None)
        os.environ.update({k: v for k, v in env.items() if "\x00" not in v})
        try:
            checks: LaunchChecks | None = run_check(argv, gpus, memory, None, BUDGET_S)
        except BadInput as exc:
            assert exc.message and "\n" not in exc.message and exc.exit_code == 2
            checks = None
    assert time.monotonic() - started < QUICK_S, argv
    assert checks is None or checks.skipped == (), checks.skipped
    return checks


@FUZZ
@given(launchers, flag_groups, environments, st.none() | st.integers(1, 1024))
def test_command_lines_return_or_are_bad_input(launcher, groups, env, gpus):
    checked([*launcher, "--rlhf_type", "grpo", *flatten(groups)], env, gpus, 80 << 30)


valid_numbers = st.fixed_dictionaries({}, optional={flag: in_range(flag)
                                                   for flag in sorted(SWIFT_NUMBERS)})
valid_words = st.lists(st.one_of(
    st.tuples(st.sampled_from(["use_vllm", "async_generate", "offload_model", "save_only_model"]),
              st.sampled_from([["true"], ["false"], []])),
    st.tuples(st.just("vllm_mode"), st.sampled_from([["colocate"], ["server"]])),
    st.tuples(st.just("tuner_type"), st.sampled_from([["full"], ["lora"]])),
    st.tuples(st.just("deepspeed"), st.sampled_from([["zero2"], ["zero3"], ["zero3_offload"]])),
    st.tuples(st.just("dataset"), st.integers(1, 10**12).map(lambda n: [f"hub/data#{n}"]))),
    max_size=6)
valid_environments = st.fixed_dictionaries({}, optional={
    "NPROC_PER_NODE": st.integers(1, 1024).map(str), "NNODES": st.integers(1, 100_000).map(str),
    "CUDA_VISIBLE_DEVICES": st.lists(st.integers(0, 15).map(str), max_size=16).map(",".join)})


@FUZZ
@given(valid_numbers, valid_words, valid_environments, st.none() | st.integers(1, 1024),
       st.none() | st.integers(1, 1 << 50))
def test_numbers_swift_accepts_pass_and_every_check_finishes(numbers, words, env, gpus, memory):
    argv = ["swift", "rlhf", "--rlhf_type", "grpo", "--use_vllm", "true",
            *flatten([(flag, [value]) for flag, value in numbers.items()]), *flatten(words)]
    assert parse_command(argv, env).error == ""
    checks = checked(argv, env, gpus, memory)
    assert checks is not None
    if checks.plan:     # steer towards the batches whose valid values were once listed forever
        target(math.log10(checks.plan.generation_batch_size), label="log10 generation batch")


@FUZZ
@given(launchers, flag_groups, environments)
def test_as_watch_runs_them_nothing_raises_and_every_skip_is_explained(launcher, groups, env):
    config = parse_command([*launcher, "--rlhf_type", "grpo", *flatten(groups)], env)
    assert "\n" not in config.error
    started = time.monotonic()
    checks = launch_checks(config, [], BUDGET_S, gpu_count=8, gpu_memory=80 << 30)
    assert time.monotonic() - started < QUICK_S
    for skipped in checks.skipped:
        what, _, why = skipped.partition(" (")
        assert why[:-1] in config.error, skipped     # a number parse_command already named


def write(directory: str, name: str, doc: Any, form: str) -> str:
    path = Path(directory) / name
    if form == "yaml":
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    else:
        path.write_text(json.dumps(doc))
    return str(path)


@FUZZ
@given(swift_configs, st.sampled_from(["config.yaml", "config.yml", "config.json"]), flag_groups)
def test_swift_config_files_return_or_are_bad_input(doc, name, groups):
    with tempfile.TemporaryDirectory() as tmp:
        path = write(tmp, name, doc, "json" if name.endswith(".json") else "yaml")
        checked(["swift", "rlhf", path, *flatten(groups)], {}, 8, 80 << 30)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from(["c.yaml", "c.json", "ds.json", "data.jsonl",
                                                 "data.json", "data.csv", "data.tsv"]))
def test_random_bytes_in_any_file_return_or_are_bad_input(data, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        (Path(tmp) / "config.json").write_bytes(data)
        grpo = ["--rlhf_type", "grpo", "--num_generations", "2", "--model", tmp]
        argv = {"c": ["swift", "rlhf", str(path), *grpo], "ds": ["swift", "rlhf", *grpo,
                                                                 "--deepspeed", str(path)]}
        checked(argv.get(name.split(".")[0], ["swift", "rlhf", *grpo, "--dataset", str(path)]),
                {"NPROC_PER_NODE": "2"}, 2, 80 << 30)


@FUZZ
@given(deepspeed_configs, model_configs, st.sampled_from(["zero3", "full", "lora"]))
def test_deepspeed_and_model_configs_return_or_are_bad_input(ds, model, tuner):
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["swift", "rlhf", "--rlhf_type", "grpo", "--use_vllm", "true", "--num_generations",
                "4", "--deepspeed", write(tmp, "ds.json", ds, "json"), "--model", tmp,
                "--tuner_type", tuner, "--dataset", "d.jsonl#100"]
        write(tmp, "config.json", model, "json")
        checked(argv, {"NPROC_PER_NODE": "4"}, 4, 80 << 30)
