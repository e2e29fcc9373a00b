"""The relay's last resort copies the job's output and returns its exit status."""
from __future__ import annotations

import os
import subprocess

from stalldoc.relay.plain import copy_until_exit


def test_copies_every_byte_and_returns_the_exit_status():
    job_r, job_w = os.pipe()
    out_r, out_w = os.pipe()
    job = subprocess.Popen(["sh", "-c", "echo first; sleep 0.3; printf 'no newline'; exit 3"],
                           stdout=job_w)
    os.close(job_w)
    job.returncode = 0   # reaped by copy_until_exit, as by the relay
    code = copy_until_exit({job_r: out_w}, job.pid, None, 0.0, drain_wait=2.0)
    os.close(out_w)
    assert code == 3
    assert os.read(out_r, 1000) == b"first\nno newline"


def test_a_job_killed_by_a_signal_is_128_plus_n():
    job_r, job_w = os.pipe()
    _, out_w = os.pipe()
    job = subprocess.Popen(["sh", "-c", "kill -USR1 $$"], stdout=job_w)
    os.close(job_w)
    job.returncode = 0
    assert copy_until_exit({job_r: out_w}, job.pid, None, 0.0, drain_wait=2.0) == 128 + 10
