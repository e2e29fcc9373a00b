"""``stalldoc attach`` given something that is no job: one line on stderr, the documented exit
code, never a traceback, nothing stored."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from support import attach


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A process that is no job (no RANK anywhere in its tree), in a session of its own."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def one_line(text: str) -> str:
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


@pytest.mark.parametrize("pid, said", [
    ("4194303", "no process has pid 4194303"),
    ("1", "pid 1 ("),
])
def test_no_job_at_that_pid(tmp_path: Path, pid: str, said: str) -> None:
    result = attach(tmp_path / "run", pid)
    assert result.code == 1
    assert said in one_line(result.stderr)
    assert not (tmp_path / "run").exists()


def test_an_ancestor_of_stalldoc_is_no_job(tmp_path: Path) -> None:
    """This test's own process is the parent of the attach it runs."""
    result = attach(tmp_path / "run", str(os.getpid()))
    assert result.code == 1
    assert "an ancestor of this stalldoc" in one_line(result.stderr)


def test_a_process_without_ranks(tmp_path: Path, sleeper: int) -> None:
    result = attach(tmp_path / "run", str(sleeper))
    assert result.code == 1
    assert f"no rank found under pid {sleeper} (sleep)" in one_line(result.stderr)
    assert not (tmp_path / "run").exists()


def test_a_pid_that_ended(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    result = attach(tmp_path / "run", str(proc.pid))
    assert result.code == 1 and "pid" in one_line(result.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run attach as another user")
def test_another_users_job(tmp_path: Path, sleeper: int) -> None:
    """attach run as nobody, pointed at a process of root's."""
    setpriv = "/usr/bin/setpriv"
    if not os.access(setpriv, os.X_OK):
        pytest.skip("setpriv is not installed")
    python = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
              "-m", "stalldoc"]
    tmp_path.chmod(0o777)
    result = attach(tmp_path / "run", str(sleeper), python=python)
    if "No module named" in result.stderr or "Permission denied" in result.stderr:
        pytest.skip(f"nobody cannot run stalldoc here: {result.stderr.strip()[-200:]}")
    assert result.code == 1
    assert f"pid {sleeper} (sleep) belongs to root" in one_line(result.stderr)


@pytest.mark.parametrize("args, said", [
    ((), "Missing argument 'PID...'"),
    (("--stall-timeout", "5", "123"), "--stall-timeout applies with --follow"),
    (("0",), "0 is not in the range"),
])
def test_usage_errors(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    result = attach(tmp_path / "run", *args)
    assert result.code == 2 and said in result.stderr and "Traceback" not in result.stderr


def test_an_unreadable_log(tmp_path: Path) -> None:
    """The log is checked once the job is found: a job of this test's own is needed, so the
    check is made against the LogTail directly."""
    from stalldoc.attach.log_tail import LogTail
    from stalldoc.attach.target import NotAttachable

    with pytest.raises(NotAttachable, match="cannot read --log .*missing.log"):
        LogTail(tmp_path / "missing.log")
    assert NotAttachable("x").exit_code == 1
