"""Launchers and environment runners told by the program a command line runs, as /proc shows
the command lines of what users start (console scripts run by their interpreter)."""
from __future__ import annotations

import pytest

from stalldoc.probes.command_line import is_launcher, is_runner, program

PY = "/opt/venv/bin/python3.11"
SITE = "/opt/venv/lib/python3.11/site-packages"


@pytest.mark.parametrize("cmdline", [
    [PY, "/opt/venv/bin/torchrun", "--nproc_per_node", "8", "train.py"],
    [PY, "-u", "-m", "torch.distributed.run", "--nnodes=2", "train.py"],
    [PY, "-X", "faulthandler", "-m", "torch.distributed.launch", "train.py"],
    [PY, "-um", "torch.distributed.run", "train.py"],
    [PY, f"{SITE}/torch/distributed/run.py", "--nproc_per_node=2", "train.py"],
    [PY, "/opt/venv/bin/deepspeed", "--num_gpus", "8", "train.py", "--deepspeed", "ds.json"],
    [PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=eyJsb2NhbGhvc3QiOiBbMF19"],
    [PY, "/opt/venv/bin/ds", "train.py"],
    [PY, "/opt/venv/bin/accelerate", "launch", "--num_processes", "2", "train.py"],
    [PY, "-m", "accelerate.commands.launch", "train.py"],
    [PY, "/opt/venv/bin/swift", "rlhf", "--rlhf_type", "grpo"],
    [PY, f"{SITE}/swift/cli/main.py", "rlhf"],
    ["/usr/local/bin/torchrun", "train.py"],
    [PY, "/opt/venv/bin/fabric", "run", "--accelerator=cuda", "--devices=8", "train.py"],
    [PY, "/opt/venv/bin/lightning", "run", "model", "--devices=2", "train.py"],
    [PY, "/opt/venv/bin/trl", "grpo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct"],
    [PY, "/opt/venv/bin/trl", "sft", "--config", "sft.yaml"],
    [PY, "/opt/venv/bin/ft_launcher", "--nproc-per-node", "8", "--max-restarts", "3", "train.py"],
    [PY, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", "train.py"],
])
def test_launchers_are_told_by_their_program(cmdline):
    assert is_launcher(cmdline) and not is_runner(cmdline)


@pytest.mark.parametrize("cmdline", [
    [PY, "train.py", "--deepspeed", "ds_zero3.json"],          # HF Trainer's flag
    [PY, "finetune_accelerate.py", "--mixed_precision", "bf16"],
    [PY, "-m", "trl.scripts.grpo", "--config", "torchrun_like.yaml"],
    [PY, f"{SITE}/swift/cli/rlhf.py", "--rlhf_type", "grpo"],  # the rank swift starts
    [PY, "-c", "import deepspeed; print(deepspeed.__version__)"],
    [PY, "/home/me/torchrun_notes/eval.py"],
    ["bash", "run_deepspeed.sh"],
    [PY, "/opt/venv/bin/fabric", "--help"],
    [PY, "fabric_run.py", "run"],
    [PY, "/opt/venv/bin/trl", "vllm-serve", "--model", "Qwen/Qwen2.5-0.5B-Instruct"],
    [PY, "/opt/venv/bin/trl", "env"],
    [PY, f"{SITE}/trl/scripts/grpo.py", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct"],
])
def test_programs_that_only_mention_a_launcher_are_none(cmdline):
    assert not is_launcher(cmdline)


@pytest.mark.parametrize("cmdline,runner", [
    ([PY, "/opt/conda/bin/conda", "run", "-n", "rl", "python", "train.py"], True),
    ([PY, "/opt/conda/bin/conda", "--no-plugins", "run", "python", "train.py"], True),
    ([PY, "/opt/conda/bin/conda", "install", "pytorch"], False),
    ([PY, "/root/.local/bin/poetry", "run", "python", "train.py"], True),
    (["/root/.cargo/bin/uv", "run", "train.py"], True),
    ([PY, "poetry_run.py"], False),
    ([PY, "/opt/venv/bin/wandb", "agent", "team/grpo-sweeps/8f2k1x"], True),
    ([PY, "/opt/venv/bin/wandb", "login"], False),
])
def test_runners_run_a_program(cmdline, runner):
    assert is_runner(cmdline) is runner
    assert not is_launcher(cmdline)


def test_the_program_is_read_past_the_interpreters_own_options():
    assert program([PY, "-u", "-W", "ignore", "-X", "dev", "-B", "train.py", "-m", "x"]) == (
        program([PY, "train.py", "-m", "x"]))
    assert program([PY, "-Wignore", "-m", "pkg.main", "--lr", "1e-5"]).name == "pkg.main"
    assert program([PY, "-c", "pass", "arg"]).kind == "code"
    assert program([PY]).kind == "python" and program([]).name == ""
