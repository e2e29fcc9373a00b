"""`stalldoc doctor` run as a user runs it, on this machine: real children of real interpreters,
real py-spy, a real seccomp refusal of ptrace, real directories and sockets."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
SANDBOX = TESTS / "sandbox.py"
NAMES = ["command", "py-spy", "agent", "nvml", "cuda", "run-dir", "versions", "flight-recorder",
         "metrics-port"]


def doctor(*args: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None,
           cwd: Path | None = None, python: str = sys.executable, names: list[str] = NAMES
           ) -> tuple[int, dict[str, dict]]:
    """Run `stalldoc doctor --format json ARGS`; (exit code, check name -> check)."""
    proc = subprocess.run([*prefix, python, "-m", "stalldoc", "doctor", "--format", "json",
                           *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    assert proc.stderr == "" or "Traceback" not in proc.stderr, proc.stderr
    document = json.loads(proc.stdout)
    assert [c["name"] for c in document["checks"]] == names
    assert document["ok"] == (proc.returncode == 0)
    return proc.returncode, {c["name"]: c for c in document["checks"]}


def test_a_plain_python_command_passes_and_the_json_has_its_shape(tmp_path):
    code, checks = doctor("--", "python", "train.py", cwd=tmp_path)
    assert code == 0, checks
    for check in checks.values():
        assert set(check) == {"name", "status", "summary", "fix", "facts"}
        assert check["status"] in ("ok", "warning", "skipped"), check
    assert checks["agent"]["status"] == "ok" and checks["py-spy"]["status"] == "ok"
    assert checks["run-dir"]["facts"]["path"] == str(tmp_path / "stalldoc-runs" /
                                                     "<UTC time>-<id>")
    assert checks["run-dir"]["facts"]["journal"] == "wal"
    assert checks["versions"]["facts"]["versions"]["torch"].startswith("2.13")


def test_the_text_form_is_one_line_per_check_and_exit_codes_are_documented(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stalldoc", "doctor", "--", "python", "-I",
                           "train.py"], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split()[1] for line in lines] == NAMES
    assert proc.returncode == 1 and "problem  agent" in proc.stdout
    assert "fix: start python without -I" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "stalldoc", "doctor", "--metrics-port", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("command,said", [
    (["python", "-I", "train.py"], "isolated mode (-I)"),
    (["python", "-S", "-u", "train.py"], "-S skips the site module"),
    (["python", "-E", "train.py"], "-E ignores every PYTHON* variable"),
    (["env", "-i", "python3", "train.py"], "the bootstrap never ran"),
])
def test_interpreters_that_keep_the_agent_out_are_a_problem(tmp_path, command, said):
    code, checks = doctor("--", *command, cwd=tmp_path)
    assert code == 1
    assert checks["agent"]["status"] == "problem" and said in checks["agent"]["summary"]
    assert checks["agent"]["fix"]


def test_a_wrapper_that_replaces_pythonpath_is_a_problem(tmp_path):
    # GIVEN the launch script many clusters use, which sets PYTHONPATH to the code's directory
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\nset -e\ncd /opt/project\nexport PYTHONPATH=/opt/project/src\n"
                      "torchrun --nproc_per_node 8 train.py \"$@\"\n")
    script.chmod(0o755)
    for command in ([str(script)], ["bash", str(script)]):
        code, checks = doctor("--", *command, cwd=tmp_path)
        assert code == 1
        agent = checks["agent"]
        assert agent["status"] == "problem", agent
        assert "export PYTHONPATH=/opt/project/src" in agent["summary"]
        assert "$PYTHONPATH" in agent["fix"]
    # AND one that keeps it is fine
    script.write_text("#!/bin/bash\nexport PYTHONPATH=/opt/project/src:$PYTHONPATH\n"
                      "python train.py\n")
    code, checks = doctor("--", str(script), cwd=tmp_path)
    assert checks["agent"]["status"] == "ok", checks["agent"]


def test_console_scripts_and_local_wrappers_use_the_interpreter_they_run(tmp_path):
    # torchrun's #! line names this venv's python; taskset runs it pinned, as the job would be
    code, checks = doctor("--", "taskset", "-c", "0", "torchrun", "--nproc_per_node", "2",
                          "train.py", cwd=tmp_path)
    assert checks["command"]["facts"]["how"].startswith("the interpreter of torchrun's #! line")
    assert os.path.dirname(checks["command"]["facts"]["python"][0]) == os.path.dirname(
        sys.executable)
    assert checks["agent"]["status"] == "ok" and checks["py-spy"]["status"] == "ok"
    assert code == 0


def test_a_venv_without_stalldoc_still_gets_the_agent(tmp_path):
    # GIVEN the job's own venv, with neither stalldoc nor py-spy in it
    venv.EnvBuilder(with_pip=False).create(tmp_path / "jobenv")
    python = str(tmp_path / "jobenv" / "bin" / "python")
    code, checks = doctor("--", python, "train.py", cwd=tmp_path)
    # THEN the agent loads there (watch links the package into its bootstrap)
    assert checks["agent"]["status"] == "ok", checks["agent"]
    assert checks["agent"]["facts"]["executable"] == python
    assert checks["versions"]["status"] == "skipped"


def test_ptrace_denied_by_a_seccomp_filter_is_a_problem_with_the_fallback_said(tmp_path):
    # GIVEN stalldoc itself under a seccomp filter that denies ptrace (a container's profile)
    code, checks = doctor("--", "python", "train.py", prefix=(sys.executable, str(SANDBOX)),
                          cwd=tmp_path)
    spy = checks["py-spy"]
    # THEN py-spy's refusal is the problem, its reason and the fallback are said
    assert code == 1 and spy["status"] == "problem", spy
    assert spy["facts"]["seccomp"] == 2 and "seccomp filter" in spy["summary"]
    assert "faulthandler" in spy["summary"] and "CAP_SYS_PTRACE" in spy["fix"]
    assert checks["agent"]["status"] == "ok"   # the fallback has an agent to ask


def test_py_spy_missing_is_a_problem(tmp_path):
    # GIVEN stalldoc run from an interpreter with no py-spy beside it nor on PATH
    env_dir = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    import stalldoc
    import click
    (site / "deps.pth").write_text(
        f"{Path(stalldoc.__file__).parent.parent}\n{Path(click.__file__).parent.parent}\n")
    code, checks = doctor("--", "python3", "train.py", python=str(env_dir / "bin" / "python"),
                          env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    spy = checks["py-spy"]
    assert spy["status"] == "problem" and "py-spy is not installed" in spy["summary"]
    assert spy["fix"].startswith("pip install py-spy")


def test_a_run_directory_watch_would_refuse_is_a_problem(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)   # writable by all, no sticky bit: another user could swap the run dir
    code, checks = doctor("--run-dir", str(shared / "run1"), "--", "python", "t.py")
    run_dir = checks["run-dir"]
    assert code == 1 and run_dir["status"] == "problem"
    assert "writable by every user" in run_dir["summary"]
    # AND watch refuses it indeed, with the same words
    watch = subprocess.run([sys.executable, "-m", "stalldoc", "watch", "--run-dir",
                            str(shared / "run1"), "--", "true"], capture_output=True, text=True,
                           timeout=60)
    assert watch.returncode == 125 and "writable by every user" in watch.stderr
    # AND a non-empty one of ours is refused too
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    code, checks = doctor("--run-dir", str(full), "--", "python", "t.py")
    assert checks["run-dir"]["status"] == "problem" and "not empty" in checks["run-dir"]["summary"]


def test_a_metrics_port_in_use_is_a_problem(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, checks = doctor("--metrics-port", str(port), "--", "python", "t.py", cwd=tmp_path)
        assert code == 1 and checks["metrics-port"]["status"] == "problem"
        assert "in use" in checks["metrics-port"]["summary"]
    code, checks = doctor("--metrics-port", str(port), "--", "python", "t.py", cwd=tmp_path)
    assert checks["metrics-port"]["status"] == "ok"


def test_the_gpu_end_to_end_says_why_it_did_not_run_without_a_gpu(tmp_path):
    from support import gpu_present
    if gpu_present():
        pytest.skip("a GPU is here: tests/gpu runs the end-to-end for real")
    code, checks = doctor("--gpu", "--", "python", "t.py", cwd=tmp_path, names=NAMES + [
        "gpu-end-to-end"])
    assert code == 0
    assert checks["gpu-end-to-end"]["status"] == "skipped"
    assert "no CUDA device" in checks["gpu-end-to-end"]["summary"]


def test_with_ptrace_denied_and_no_agent_there_are_no_stacks_at_all(tmp_path):
    code, checks = doctor("--", "python", "-I", "train.py",
                          prefix=(sys.executable, str(SANDBOX)), cwd=tmp_path)
    assert code == 1 and checks["agent"]["status"] == "problem"
    assert "watch will have no stacks at all" in checks["py-spy"]["summary"]
