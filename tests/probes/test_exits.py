from __future__ import annotations

import os
import signal
import time

from stalldoc.probes.exits import from_wait_status, parse_launcher_line, zombie_status

# Verbatim lines printed by torchrun 2.13 (ChildFailedError and the agent's own log).
TORCHRUN_ROOT_CAUSE = "  exitcode  : -9 (pid: 2869)"
TORCHRUN_AGENT = ("E1121 13:51:17.4 2862 torch/distributed/elastic/multiprocessing/api.py:882] "
                  "failed (exitcode: 1) local_rank: 1 (pid: 4242) of binary: /usr/bin/python")


def test_launcher_reports():
    assert parse_launcher_line(TORCHRUN_ROOT_CAUSE) == (2869, -9)
    assert parse_launcher_line(TORCHRUN_AGENT) == (4242, 1)
    assert parse_launcher_line("exitcode is a word here") is None


def test_zombie_status_of_a_real_zombie():
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        deadline = time.time() + 5
        status = None
        while status is None and time.time() < deadline:
            status = zombie_status(pid)
            time.sleep(0.01)
        assert status is not None
        assert from_wait_status(status) == (128 + 9, 9)
    finally:
        os.waitpid(pid, 0)
    assert zombie_status(pid) is None  # reaped: gone


def test_exit_status_without_signal():
    assert from_wait_status(3 << 8) == (3, None)
