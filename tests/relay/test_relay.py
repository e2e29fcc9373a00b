"""Who ended the job, as the relay tells the sidecar and the store keeps it, beside watch's own
exit code."""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from support import run_meta, start_watch, torchrun, wait_for_line

SLEEPER = "import time; print('ready', flush=True); time.sleep(120)"


def test_sigint_to_watch_is_stored_as_an_interrupt(tmp_path):
    # GIVEN a watched job that is running
    watch = start_watch(tmp_path / "run", [sys.executable, "-c", SLEEPER])
    try:
        wait_for_line(watch.stdout, "ready", [])
        # WHEN watch gets SIGINT (no terminal: the relay forwards it to the job)
        watch.send_signal(signal.SIGINT)
        _, stderr = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    # THEN the job ended on it (Python's KeyboardInterrupt: exit 1), and the store says the
    # user interrupted it, with watch's code (the job's)
    assert "KeyboardInterrupt" in stderr and watch.returncode == 1, stderr
    meta = run_meta(tmp_path / "run")
    assert (meta["ended_by"], meta["watch_exit_code"]) == ("interrupt", "1")
    # AND the rank's end is the user's, no finding: not "exited with status 1" and its fix
    assert "SD103" not in stderr and "exited with status" not in stderr, stderr


def test_ranks_the_terminals_ctrl_c_killed_are_no_dead_ranks(tmp_path):
    # GIVEN torchrun's two ranks in a long DDP loop, watched (at a terminal, Ctrl-C goes to the
    # job's process group, which has the terminal's foreground: the relay never sees it)
    env = {"STEPS": "100000", "STEP_PAUSE": "0.2"}
    watch = start_watch(tmp_path / "run", torchrun(2, "ddp_steps.py"), env=env)
    try:
        wait_for_line(watch.stderr, "rank 1: pid", [])
        time.sleep(3)
        launcher = next(p for p in psutil.Process(watch.pid).children(recursive=True)
                        if "torch.distributed.run" in " ".join(p.cmdline()))
        # WHEN SIGINT reaches every process of the job's group at once, as Ctrl-C does
        os.killpg(os.getpgid(launcher.pid), signal.SIGINT)
        _, stderr = watch.communicate(timeout=90)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    # THEN the ranks killed by SIGINT are no dead ranks: no finding, no fix to read
    assert "KeyboardInterrupt" in stderr and "SD103" not in stderr, stderr[-3000:]
