"""Which interpreter a command runs, found the way the command will find it (real files, real
PATH lookups)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from stalldoc.probes.interpreter import resolve


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_a_console_script_runs_its_shebangs_interpreter_with_its_flags(tmp_path):
    # GIVEN a console script whose #! line goes through env -S with a flag, on PATH
    _script(tmp_path / "swift", "#!/usr/bin/env -S python3 -u\nimport sys\n")
    env = {"PATH": f"{tmp_path}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    target = resolve(["swift", "rlhf", "--rlhf_type", "grpo"], env)
    assert target.python == (os.path.join(os.path.dirname(sys.executable), "python3"), "-u")
    assert "swift's #! line" in target.how and target.prefix == ()


def test_a_cluster_launcher_is_looked_through_but_not_run_by_the_children(tmp_path):
    # GIVEN an executable named srun on PATH (a binary, as Slurm's is: it is never run here)
    shutil.copy("/bin/true", tmp_path / "srun")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    target = resolve(["srun", "-N", "2", sys.executable, "-X", "dev", "-I", "train.py"], env)
    assert target.python == (sys.executable, "-X", "dev", "-I")
    assert target.blind_flags == ("-I",)
    assert target.prefix == () and "started by srun" in target.how


def test_local_wrappers_stay_in_front_and_env_changes_the_lookup(tmp_path):
    target = resolve(["env", "-i", "PATH=/usr/bin:/bin", "python3", "x.py"], dict(os.environ))
    assert target.python == ("/usr/bin/python3",)
    assert target.argv == ("env", "-i", "PATH=/usr/bin:/bin", "/usr/bin/python3")
    assert resolve(["nohup", "nice", "-n", "5", sys.executable, "x.py"]).prefix == (
        "nohup", "nice", "-n", "5")


def test_a_shell_wrapper_tells_its_lines_that_keep_the_agent_out(tmp_path):
    wrapper = _script(tmp_path / "run.sh", (
        "#!/bin/bash\n# export PYTHONPATH=/commented/out\n"
        "export PYTHONPATH=/code/src\n"
        "PYTHONPATH=$PYTHONPATH:/code/extra python -u train.py\n"
        "python3 -Es eval.py\n"))
    target = resolve([str(wrapper)])
    assert target.wrapper == str(wrapper)
    assert target.wrapper_lines == ("export PYTHONPATH=/code/src", "python3 -Es eval.py")


def test_a_command_not_found_says_so():
    target = resolve(["no-such-launcher-here", "x"], {"PATH": "/usr/bin:/bin"})
    assert target.error == "no-such-launcher-here: command not found"
