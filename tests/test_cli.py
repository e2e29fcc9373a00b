"""The watch command's contract: exit codes, signals, the job tree, bad input, agent failure."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import SCENARIOS, pid_alive, stand_in_swift, torchrun, watch

STALLDOC = [sys.executable, "-m", "stalldoc"]


def test_exit_code_is_the_commands(tmp_path):
    result = watch(tmp_path, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert result.code == 7
    report = result.report()
    assert report["run"]["exit_code"] == 7
    assert report["run"]["command"] == ["sh", "-c", "echo out; echo err >&2; exit 7"]
    assert (os.stat(result.run_dir).st_mode & 0o777) == 0o700


def test_killed_command_gives_128_plus_signal(tmp_path):
    assert watch(tmp_path, ["sh", "-c", "kill -9 $$"]).code == 128 + 9


def test_missing_and_non_executable_commands(tmp_path):
    missing = subprocess.run([*STALLDOC, "watch", "--run-dir", str(tmp_path / "a"), "--",
                              "no-such-command-xyz"], capture_output=True, text=True)
    assert missing.returncode == 127
    assert missing.stderr.strip() == "stalldoc: command not found: no-such-command-xyz"
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    denied = subprocess.run([*STALLDOC, "watch", "--run-dir", str(tmp_path / "b"), "--",
                             str(script)], capture_output=True, text=True)
    assert denied.returncode == 126
    assert denied.stderr.strip() == f"stalldoc: command not executable: {script}"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_usage_errors_are_one_line(tmp_path):
    bad = subprocess.run([*STALLDOC, "watch", "--on-stall", "explode", "--", "true"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "'explode' is not one of 'observe', 'kill'" in bad.stderr


def test_non_empty_run_dir_is_refused_before_launch_and_left_as_it_was(tmp_path):
    (tmp_path / "old").write_text("x")
    tmp_path.chmod(0o755)
    marker = tmp_path / "launched"
    out = subprocess.run([*STALLDOC, "watch", "--run-dir", str(tmp_path), "--", "touch",
                          str(marker)], capture_output=True, text=True)
    assert out.returncode == 125
    assert out.stderr.strip() == f"stalldoc: run directory is not empty: {tmp_path}"
    assert not marker.exists()
    assert (tmp_path.stat().st_mode & 0o7777) == 0o755


def test_empty_run_dir_is_a_usage_error_and_the_current_directory_is_left_alone(tmp_path):
    tmp_path.chmod(0o755)
    out = subprocess.run([*STALLDOC, "watch", "--run-dir", "", "--", "touch", "launched"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("Error:")] == [
        "Error: Invalid value for '--run-dir': must not be empty"]
    assert list(tmp_path.iterdir()) == [] and (tmp_path.stat().st_mode & 0o7777) == 0o755


HUGE = "9" * 400
BAD_NUMBERS = [
    ("watch", "--kill-grace", "nan", "nan is not a finite number"),
    ("watch", "--kill-grace", "inf", "is not in the range 0<=x<=3600"),
    ("watch", "--kill-grace", "1e300", "is not in the range 0<=x<=3600"),
    ("watch", "--stall-timeout", "nan", "nan is not a finite number"),
    ("watch", "--stall-timeout", "1e300", "is not in the range 0.5<=x<=2592000"),
    ("watch", "--busy-timeout", "nan", "nan is not a finite number"),
    ("watch", "--busy-timeout", "1e300", "is not in the range 1<=x<=2592000"),
    ("watch", "--interval", "nan", "nan is not a finite number"),
    ("watch", "--interval", "1e300", "is not in the range 0.05<=x<=3600"),
    ("demo", "--stall-timeout", "nan", "nan is not a finite number"),
    ("demo", "--stall-timeout", "inf", "is not in the range 1<=x<=2592000"),
    ("check", "--gpus", HUGE, "is not in the range 1<=x<=1024"),
    ("check", "--dataset-size", HUGE, "is not in the range 1<=x<=1000000000000000"),
    ("check", "--gpu-memory", HUGE + "G", "not a memory size"),
    ("check", "--gpu-memory", "0G", "out of range (1 byte to 1 PiB)"),
]


@pytest.mark.parametrize("command,option,value,why", BAD_NUMBERS,
                         ids=[f"{c} {o} {v[:6]}" for c, o, v, _ in BAD_NUMBERS])
def test_nan_infinite_and_huge_numbers_are_one_line_usage_errors(tmp_path, command, option,
                                                                 value, why):
    marker = tmp_path / "launched"
    job = ["--", "touch", str(marker)] if command == "watch" else []
    if command == "check":
        job = ["--", "swift", "rlhf", "--rlhf_type", "grpo", "--dataset", "x.jsonl"]
    out = subprocess.run([*STALLDOC, command, option, value, *job], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    [line] = [ln for ln in out.stderr.splitlines() if ln.startswith(("Error:", "stalldoc:"))]
    assert why in line
    assert list(tmp_path.iterdir()) == []     # nothing started, no run directory


def test_report_refuses_what_it_cannot_read(tmp_path):
    empty = subprocess.run([*STALLDOC, "report", str(tmp_path)], capture_output=True, text=True)
    assert empty.returncode == 1
    assert empty.stderr.strip() == f"stalldoc: no stalldoc run database in {tmp_path} (expected run.db)"
    (tmp_path / "run.db").write_text("not sqlite")
    garbage = subprocess.run([*STALLDOC, "report", str(tmp_path)], capture_output=True, text=True)
    assert garbage.returncode == 1
    assert "not a readable stalldoc database" in garbage.stderr
    assert len(garbage.stderr.strip().splitlines()) == 1


def test_secrets_are_redacted_in_the_stored_command(tmp_path):
    result = watch(tmp_path, ["sh", "-c", "true", "--hub_token", "hf_abcdefghijklmnop",
                              "--api-key=xyz", "sk-abcdefghijklmnopqrst"])
    command = result.report()["run"]["command"]
    assert command == ["sh", "-c", "true", "--hub_token", "***", "--api-key=***", "***"]


def _rank_pids(run_dir: Path, count: int, timeout: float = 60) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = list((run_dir / "agents").glob("agent-*.state")) if (run_dir / "agents").exists() else []
        from stalldoc.agent.state_reader import read_state
        ranks = [s for s in (read_state(str(p)) for p in states) if s.rank >= 0]
        if len(ranks) >= count and all(s.collective_seq > 0 for s in ranks):
            return [s.pid for s in ranks]
        time.sleep(0.3)
    raise AssertionError("ranks did not start")


def test_sigterm_ends_the_whole_job_tree(tmp_path):
    # GIVEN a watched torchrun job whose ranks hang (the ranks run in sessions of their own)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*STALLDOC, "watch", "--run-dir", str(run_dir), "--kill-grace", "2",
                             "--", *torchrun(2, "collective_wait.py")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "STUCK_RANK": "0", "STUCK_STEP": "1"})
    pids = _rank_pids(run_dir, 2)
    # WHEN stalldoc itself gets SIGTERM
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    # THEN no rank survives, and the exit code is the job's
    time.sleep(0.5)
    assert [p for p in pids if pid_alive(p)] == []
    assert code != 0
    stored = json.loads(subprocess.run([*STALLDOC, "report", str(run_dir), "--format", "json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert stored["run"]["exit_code"] == code
    assert [f for f in stored["findings"] if f["code"] == "SD103"] == []  # we ended them


def test_sigint_is_forwarded_to_the_job(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*STALLDOC, "watch", "--run-dir", str(run_dir), "--", "sh", "-c",
                             "trap 'exit 42' INT; echo trapped; while true; do sleep 0.1; done"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "trapped\n"  # the job runs
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 42


def test_agent_that_cannot_write_its_state_leaves_the_job_running(tmp_path):
    # the state file's path is taken by a directory: the agent fails to create it
    script = (f'mkdir -p "$STALLDOC_AGENT_DIR/agent-$$.state"; '
              f'exec {sys.executable} {SCENARIOS / "single_wait.py"}')
    result = watch(tmp_path, ["sh", "-c", script], "--on-stall", "kill")
    assert result.code == 124
    errors = (result.run_dir / "agent-errors.log").read_text()
    assert "stalldoc agent disabled" in errors and "IsADirectoryError" in errors
    [finding] = result.findings("SD106")  # diagnosed from py-spy and psutil alone
    assert finding["evidence"]["frame"].startswith("await_reply (")


def test_no_agent_still_finds_the_culprit_from_stacks(tmp_path):
    result = watch(tmp_path, torchrun(2, "collective_wait.py"), "--no-agent", "--on-stall", "kill",
                   env={"STUCK_RANK": "1", "STUCK_FUNC": "download_weights"})
    assert result.code == 124
    assert not (result.run_dir / "agents").exists()
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [1]
    assert finding["evidence"]["frame"].startswith("download_weights (")


def stalldoc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stalldoc", *args], capture_output=True,
                          text=True)


def test_rules_lists_every_rule_and_explain_prints_one():
    from stalldoc.rules import RULES
    listed = json.loads(stalldoc("rules", "--format", "json").stdout)
    assert [r["code"] for r in listed] == [r.code for r in RULES]
    text = stalldoc("rules").stdout.splitlines()
    assert text[0].split() == ["CODE", "SEVERITY", "RUNS", "NAME", "SUMMARY"]
    assert text[1].split()[:4] == ["SD101", "error", "stall", "rank-outside-collective"]
    assert len([line for line in text if line.startswith("SD")]) == len(RULES)
    out = stalldoc("explain", "sd503")
    assert out.returncode == 0
    for section in ("What it does", "Why is this bad?", "Evidence", "Fix", "References"):
        assert f"\n    {section}\n" in out.stdout or f"\n{section}\n" in out.stdout
    assert out.stdout.startswith("SD503 vllm-kv-cache-memory (error; runs on every sample while "
                                 "the job runs")


def test_explain_unknown_code_is_one_line_exit_2():
    out = stalldoc("explain", "SD999")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "stalldoc: no rule has code 'SD999'; `stalldoc rules` lists them"]


def test_launch_checks_are_printed_stored_and_never_block(tmp_path):
    # a stand-in `swift` executable: what is under test is stalldoc reading the command line
    swift = stand_in_swift(tmp_path)
    result = watch(tmp_path, [str(swift), "rlhf", "--rlhf_type", "grpo", "--use_vllm", "true",
                              "--num_generations", "2", "--per_device_train_batch_size", "2",
                              "--async_generate", "true", "--offload_model", "true",
                              "--deepspeed", "zero3_offload"])
    assert result.code == 0, result.stderr
    before = result.stderr.split("swift ran")[0] if "swift ran" in result.stderr else result.stderr
    assert "before launch:" in before and "[SD403 error] async_generate with vllm_mode" in before
    launch = [f for f in result.report()["findings"] if f["trigger"] == "launch"]
    assert sorted(f["code"] for f in launch) == ["SD403", "SD405"]


def test_metrics_port_in_use_is_an_error_before_launch(tmp_path):
    marker = tmp_path / "ran"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = watch(tmp_path, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                       "--metrics-port", str(port))
    assert result.code == 125 and not marker.exists()
    # one true line: nothing about a job that never started running on
    assert result.stderr.strip().splitlines() == [
        f"stalldoc: cannot serve metrics on 127.0.0.1:{port}: Address already in use"]


@pytest.mark.parametrize("command", ["", "watch", "attach", "report", "check", "doctor",
                                     "explain", "rules", "demo"])
def test_help_fits_an_80_column_terminal(command: str) -> None:
    out = subprocess.run([*STALLDOC, *command.split(), "--help"], capture_output=True,
                         text=True, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stdout.splitlines() if len(line) > 80] == []
