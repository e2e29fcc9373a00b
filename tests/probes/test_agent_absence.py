"""Why a real Python process has no agent, read from its command line and environment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalldoc.probes.agent_absence import (blind_flags, interpreter_flags, is_python,
                                           why_no_agent)

SLEEP = "import time; print(1, flush=True); time.sleep(60)"


def _why(tmp_path: Path, argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        assert is_python(proc.pid)
        return why_no_agent(proc.pid, str(tmp_path / "bootstrap"))
    finally:
        proc.kill()
        proc.wait()


def _watched_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "STALLDOC_AGENT_DIR": str(tmp_path / "agents"),
            "PYTHONPATH": str(tmp_path / "bootstrap")}


@pytest.mark.parametrize("flags,said", [(["-I"], "python -I: isolated mode"),
                                        (["-E"], "python -E: -E ignores every PYTHON*"),
                                        (["-u", "-S"], "python -S: -S skips the site module"),
                                        (["-uIB"], "python -I: isolated mode")])
def test_an_interpreters_flags_say_why(tmp_path, flags, said):
    why = _why(tmp_path, [sys.executable, *flags, "-c", SLEEP], _watched_env(tmp_path))
    assert why.startswith(said), why


def test_an_environment_a_wrapper_emptied_says_why(tmp_path):
    env = {"PATH": os.environ["PATH"]}   # env -i PATH=... python train.py
    why = _why(tmp_path, [sys.executable, "-c", SLEEP], env)
    assert why.startswith("its environment has no STALLDOC_AGENT_DIR"), why


def test_a_pythonpath_a_wrapper_replaced_says_why(tmp_path):
    env = {**_watched_env(tmp_path), "PYTHONPATH": str(tmp_path / "src")}
    why = _why(tmp_path, [sys.executable, "-c", SLEEP], env)
    assert why.startswith("its PYTHONPATH does not hold stalldoc's bootstrap"), why
    assert str(tmp_path / "src") not in why   # the user's paths are not repeated


def _blind(argv: list[str]) -> list[str]:
    return blind_flags(interpreter_flags(argv[1:]))


def test_flags_after_the_script_are_the_scripts():
    assert _blind(["python3", "train.py", "-I", "-S"]) == []
    assert _blind(["python3", "-X", "dev", "-m", "torch.distributed.run", "-E"]) == []
    assert _blind(["python3", "-W", "ignore", "-ES", "train.py"]) == ["-E", "-S"]
    assert _blind(["python3", "-X", "pycache_prefix=/tmp/SIE", "train.py"]) == []


def test_a_shell_is_not_python():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not is_python(proc.pid)
    finally:
        proc.kill()
        proc.wait()
