"""The relay keeps the job whole whatever happens to stalldoc: real `stalldoc watch` processes,
real signals, a real sidecar killed or stopped mid-run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from support import SCENARIOS, pid_alive, sidecar_pid, start_watch, wait_for_line, watch

PRINTER = [sys.executable, str(SCENARIOS / "signal_printer.py")]


def _steps(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("step ")]


def test_sidecar_killed_mid_run_leaves_the_job_printing_and_its_exit_code(tmp_path):
    # GIVEN a watched job printing a line every 0.1 s, exiting 7
    proc = start_watch(tmp_path / "run", PRINTER, env={"LINES": "40", "EXIT_CODE": "7"})
    seen: list[str] = []
    wait_for_line(proc.stdout, "step 5", seen)
    # (the sidecar offers itself to the OOM killer before the job)
    sidecar = sidecar_pid(proc.pid)
    assert open(f"/proc/{sidecar}/oom_score_adj").read().strip() == "1000"
    # WHEN the sidecar is SIGKILLed mid-run
    os.kill(sidecar, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    # THEN every line came through, in order, the exit code is the job's and the relay said so once
    assert _steps("".join(seen) + out) == list(range(40))
    assert proc.returncode == 7
    assert err.count("the sidecar stopped (killed by SIGKILL") == 1, err


def test_relay_killed_mid_run_the_job_keeps_printing(tmp_path):
    # GIVEN a watched job printing a line every 0.1 s
    proc = start_watch(tmp_path / "run", PRINTER, env={"LINES": "40", "EXIT_CODE": "0"})
    seen: list[str] = []
    wait_for_line(proc.stdout, "step 5", seen)
    # WHEN the process the shell waits on is SIGKILLed
    proc.kill()
    out, err = proc.communicate(timeout=60)
    # THEN the job ran to its end and every line still came through (no BrokenPipeError)
    text = "".join(seen) + out
    assert _steps(text) == list(range(40)) and "done 0" in text, err
    assert "BrokenPipeError" not in err
    assert "the sidecar relays the job's output now" in err


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "SIGHUP",
                                  "SIGWINCH"])
def test_a_signal_to_stalldoc_reaches_the_job_which_runs_on(tmp_path, name):
    # GIVEN a watched job that handles the signal (Slurm's --signal=USR1 asks for a checkpoint)
    proc = start_watch(tmp_path / "run", PRINTER, env={"LINES": "30", "EXIT_CODE": "3",
                                                       "SIGNALS": name})
    seen: list[str] = []
    wait_for_line(proc.stdout, "step 3", seen)
    # WHEN stalldoc gets it
    proc.send_signal(getattr(signal, name))
    out, err = proc.communicate(timeout=60)
    # THEN the job got it once, finished its loop, and its exit code came back
    text = "".join(seen) + out
    assert text.count(f"got {name}") == 1, text
    assert _steps(text) == list(range(30)) and "done 1" in text
    assert proc.returncode == 3, err


def test_sigtstp_stops_the_job_and_sigcont_resumes_it(tmp_path):
    # GIVEN a watched job printing steps
    proc = start_watch(tmp_path / "run", PRINTER, env={"LINES": "30", "EXIT_CODE": "4"})
    seen: list[str] = []
    wait_for_line(proc.stdout, "step 3", seen)
    job = [c for c in psutil.Process(proc.pid).children() if "signal_printer" in " ".join(
        c.cmdline())][0]
    # WHEN stalldoc gets SIGTSTP (as a terminal's Ctrl-Z would give it)
    proc.send_signal(signal.SIGTSTP)
    time.sleep(1.0)
    # THEN the job is stopped; and SIGCONT lets it finish with its own exit code
    assert job.status() == psutil.STATUS_STOPPED
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert _steps("".join(seen) + out) == list(range(30))
    assert proc.returncode == 4, err


def test_sidecar_stopped_during_a_burst_never_blocks_the_job(tmp_path):
    # GIVEN a job that prints 30 MB of short lines once told to
    code = ("import sys, time; print('ready', flush=True);"
            "time.sleep(1.5); w = sys.stdout.write\n"
            "for i in range(600000): w(f'line {i:07d} ' + 'x' * 38 + '\\n')\n"
            "sys.stdout.flush(); print('burst done', flush=True)")
    proc = start_watch(tmp_path / "run", [sys.executable, "-c", code])
    seen: list[str] = []
    wait_for_line(proc.stdout, "ready", seen)
    # WHEN the sidecar is stopped (it hangs) while the job prints
    sidecar = sidecar_pid(proc.pid)
    os.kill(sidecar, signal.SIGSTOP)
    wait_for_line(proc.stdout, "burst done", seen)
    os.kill(sidecar, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    # THEN the job's output is complete and in order, lines not analysed are counted
    lines = [line for line in seen + out.splitlines(True) if line.startswith("line ")]
    assert len(lines) == 600000 and lines[-1].startswith("line 0599999")
    assert proc.returncode == 0
    assert "output line(s) were not analysed" in err
    report = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(tmp_path / "run")],
                            capture_output=True, text=True, check=True).stdout
    assert "not analysed" in report


def test_orphans_reparented_to_stalldoc_are_reaped(tmp_path):
    # GIVEN a job whose children start 30 grandchildren and exit at once (orphans)
    code = ("import subprocess, sys, time\n"
            "for _ in range(30): subprocess.Popen(['sh', '-c', '(sleep 0.2 &)'])\n"
            "print('spawned', flush=True); time.sleep(4)")
    proc = start_watch(tmp_path / "run", [sys.executable, "-c", code])
    seen: list[str] = []
    wait_for_line(proc.stdout, "spawned", seen)
    time.sleep(2)
    # WHEN they have ended, THEN none is a zombie under stalldoc
    zombies = [c for c in psutil.Process(proc.pid).children() if _zombie(c)]
    proc.communicate(timeout=60)
    assert zombies == []
    assert proc.returncode == 0


def _zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("end_detached", [False, True])
def test_leftovers_attached_are_ended_detached_daemons_are_left_running(tmp_path, end_detached):
    # GIVEN a job of no Python (no rank to find: the watcher guesses one) that leaves a daemon
    # that detached itself (setsid) and then a child in its group, which holds its output open
    # (the job ends once its daemon has detached, as a daemon does at its start). Once the job's
    # shell is gone the watcher sees two orphans and takes the oldest, the daemon, for the job's
    # process: its session must not become a rank's (it did, and the daemon was killed).
    script = ("setsid sleep 300 < /dev/null > /dev/null 2>&1 & d=$!; echo detached $d; "
              "sleep 300 & echo attached $!; "
              "while [ \"$(cut -d' ' -f6 /proc/$d/stat)\" = \"$(cut -d' ' -f6 /proc/$$/stat)\" ]; "
              "do sleep 0.05; done; exit 0")
    options = ["--end-detached"] if end_detached else []
    result = watch(tmp_path, ["sh", "-c", script], *options)
    pids = dict(line.split() for line in result.stdout.splitlines())
    attached, detached = int(pids["attached"]), int(pids["detached"])
    try:
        time.sleep(0.5)
        # THEN the attached one was ended; the daemon runs on unless --end-detached
        assert not pid_alive(attached)
        assert pid_alive(detached) != end_detached
        assert result.code == 0
        if not end_detached:
            assert f"left running, detached from the job (--end-detached ends them): {detached}" \
                in result.stderr
    finally:
        for pid in (attached, detached):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_stalldoc_killed_before_the_job_starts_leaves_nothing(tmp_path):
    # GIVEN stalldoc interrupted while its launch checks run
    proc = start_watch(tmp_path / "run", PRINTER)
    sidecar = sidecar_pid(proc.pid)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    # THEN it exits 130 (before the job started, or as the job did on SIGINT) and leaves no sidecar
    assert proc.returncode == 130
    assert not pid_alive(sidecar)


BIG_OUTPUT = r"""
import sys
out = sys.stdout.buffer
line = b"step %07d loss 0.1234 " + b"z" * 76 + b"\n"
for i in range(500000):                     # 50 MB of 100-byte lines
    out.write(line % i)
out.write(b"x" * (20 << 20))                # one 20 MB line without a newline...
out.write(b"\nend\n")                       # ...that ends later
"""


def _expected_output() -> bytes:
    line = b"step %07d loss 0.1234 " + b"z" * 76 + b"\n"
    return b"".join(line % i for i in range(500000)) + b"x" * (20 << 20) + b"\nend\n"


def test_50_mb_of_lines_and_a_20_mb_line_come_through_byte_for_byte(tmp_path):
    # GIVEN a job printing 50 MB of lines, then a 20 MB line without a newline
    out_path = tmp_path / "out.bin"
    with open(out_path, "wb") as out:
        proc = start_watch(tmp_path / "run", [sys.executable, "-c", BIG_OUTPUT], stdout=out)
        _, err = proc.communicate(timeout=300)
    # THEN every byte arrived in order and the job's exit code came back
    assert proc.returncode == 0, err
    assert out_path.read_bytes() == _expected_output()


def test_a_rank_that_exec_d_into_another_program_outlives_the_stall(tmp_path):
    # GIVEN a single-process job that execs into a non-Python program and stays quiet past
    # the stall timeout (default observe mode)
    code = "import os; print('exec now', flush=True); os.execv('/bin/sleep', ['sleep', '9'])"
    result = watch(tmp_path, [sys.executable, "-c", code])
    # THEN the stall is diagnosed, nothing signals the program, and its exit code (0) is kept
    assert "STALL #1" in result.stderr
    assert result.code == 0, result.stderr
