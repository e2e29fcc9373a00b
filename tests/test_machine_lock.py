"""The machine lock of the suite's parallel run (tests/machine.py), between real processes as
pytest-xdist's workers are: a test that runs alone has no test beside it, tests beside share
the machine, and one that waits to run alone is not overtaken by tests started after it."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import machine

HOLD = """\
import sys, time
sys.path.insert(0, {tests!r})
import machine
alone, seconds, log = sys.argv[1] == "alone", float(sys.argv[2]), sys.argv[3]
with machine.held(alone):
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
with open(log, "a") as out:
    out.write(f"{{sys.argv[1]}} {{start}} {{end}}\\n")
"""


def hold(tmp_path: Path, how: str, seconds: float, log: Path) -> subprocess.Popen:
    code = HOLD.format(tests=str(Path(__file__).resolve().parent))
    env = {**os.environ, "PYTEST_XDIST_WORKER": f"gw-{how}",
           "STALLDOC_TESTS_MACHINE": str(tmp_path / "machine")}   # not the suite's own lock
    return subprocess.Popen([sys.executable, "-c", code, how, str(seconds), str(log)], env=env)


def holds(proc: subprocess.Popen, path: Path, timeout: float = 30) -> None:
    """Wait until ``proc`` holds a lock on ``path`` (/proc/locks: its pid and the file's
    inode), however long a loaded machine takes to start it."""
    inode, deadline = None, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if inode is None and path.exists():
            inode = path.stat().st_ino
        if inode is not None and any(
                line.split()[4] == str(proc.pid) and line.split()[5].endswith(f":{inode}")
                for line in Path("/proc/locks").read_text().splitlines()
                if line.split()[1] == "FLOCK"):
            return
        assert proc.poll() is None, "it ended"
        time.sleep(0.02)
    raise AssertionError(f"pid {proc.pid} took no lock on {path} in {timeout} s")


def spans(log: Path) -> list[tuple[str, float, float]]:
    rows = [line.split() for line in log.read_text().splitlines()]
    return sorted((how, float(start), float(end)) for how, start, end in rows)


def test_beside_tests_share_and_one_alone_runs_with_none_beside(tmp_path: Path) -> None:
    # GIVEN a test beside (1.5 s), then one that waits to run alone, then two more beside
    # started while it waits
    log = tmp_path / "log"
    first = hold(tmp_path, "beside", 1.5, log)
    holds(first, Path(f"{tmp_path / 'machine'}.lock"))
    lone = hold(tmp_path, "alone", 1.0, log)
    holds(lone, Path(f"{tmp_path / 'machine'}.gate"))   # and waits for the machine
    later = [hold(tmp_path, "beside", 0.5, log) for _ in range(2)]
    for proc in (first, lone, *later):
        assert proc.wait(timeout=30) == 0
    # THEN the alone one ran after the first ended and before the later ones began; those two
    # ran at the same time
    rows = spans(log)
    [(_, a_start, a_end)] = [row for row in rows if row[0] == "alone"]
    beside = sorted(row[1:] for row in rows if row[0] == "beside")
    first_span, *later_spans = beside
    assert first_span[1] <= a_start, rows
    assert all(a_end <= start for start, _ in later_spans), rows
    assert max(s for s, _ in later_spans) < min(e for _, e in later_spans), rows


def test_outside_a_parallel_run_nothing_is_locked_and_loads_need_no_mark(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with machine.held(alone=True), machine.held(alone=False):
        machine.assert_alone("a CPU burner")   # a serial run: no error


def test_a_load_in_a_test_that_does_not_run_alone_fails_in_a_parallel_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw9")
    monkeypatch.delenv(machine.ALONE, raising=False)
    with pytest.raises(AssertionError, match="mark it @pytest.mark.alone"):
        machine.assert_alone("a CPU burner")
