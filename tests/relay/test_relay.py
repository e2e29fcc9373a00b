"""Who ended the job, as the relay tells the sidecar and the store keeps it, beside watch's own
exit code."""
from __future__ import annotations

import signal
import sys

from support import run_meta, start_watch, wait_for_line

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
