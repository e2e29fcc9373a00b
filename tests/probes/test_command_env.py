"""The frameworks of the interpreter a command runs (``probes/command_env.py``), read from real
installed metadata: stalldoc's own environment, real old releases of ms-swift and TRL behind
their own ``swift`` console script, and interpreters that cannot answer."""
from __future__ import annotations

import os
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from stalldoc.probes.command_env import command_versions
from support import old_release


@pytest.fixture(scope="module")
def swift_3_4(tmp_path_factory) -> dict[str, str]:
    """ms-swift 3.4.1 and TRL 0.16.1 as released, first on PATH and PYTHONPATH."""
    return old_release(tmp_path_factory.mktemp("old"), "ms-swift==3.4.1", "trl==0.16.1")


def test_the_commands_own_interpreter_says_what_is_installed():
    found = command_versions([sys.executable, "train.py"])
    for name in ("torch", "transformers", "ms-swift", "trl", "deepspeed"):
        assert found.versions[name] == metadata.version(name), name
    assert found.source == f"{sys.executable} (the command's interpreter)"
    # read here (stalldoc's own interpreter, the same environment) or in a child (a flag of
    # the command's: -u), the same answer
    assert command_versions([sys.executable, "-u", "train.py"]).versions == found.versions


def test_a_child_of_the_interpreter_reads_what_it_has_not_stalldoc(swift_3_4):
    # GIVEN `swift rollout`: the console script of the old release, first on PATH, its
    # interpreter (this virtualenv's python, as pip wrote its #! line) started by us with the
    # old release first on its path
    env = {**os.environ, **swift_3_4}
    found = command_versions(["swift", "rollout", "--model", "Qwen/Qwen2.5-7B-Instruct"], env)
    # THEN the versions are the old release's, not the ones stalldoc itself runs with
    assert (found.versions["ms-swift"], found.versions["trl"]) == ("3.4.1", "0.16.1"), found
    assert found.versions["torch"] == metadata.version("torch")
    assert "the interpreter of swift's #! line" in found.source, found.source


def test_a_command_that_is_not_there_is_said_not_read():
    found = command_versions(["no-such-launcher-here", "train.py"])
    assert found.versions == {}
    assert found.source == "not read: no-such-launcher-here: command not found"


def test_an_interpreter_that_never_answers_is_left_after_its_time(tmp_path: Path):
    # GIVEN the command's python hangs before it runs anything (a sitecustomize that waits on
    # a network file system, say)
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    started = time.monotonic()
    found = command_versions([sys.executable, "train.py"], env, timeout=2)
    # THEN nothing is read, and it is said why, without waiting for it
    assert found.versions == {} and time.monotonic() - started < 30
    assert found.source == f"not read: {sys.executable} did not answer within 2 s"
