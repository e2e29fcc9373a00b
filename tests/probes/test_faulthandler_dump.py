"""The faulthandler fallback against a real process with the agent."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from stalldoc.run.inject import agent_environment
from stalldoc.probes import faulthandler_dump

JOB = textwrap.dedent("""
    import threading, time
    def background_poll():
        time.sleep(60)
    def wait_for_weights():
        time.sleep(60)
    threading.Thread(target=background_poll, daemon=True).start()
    wait_for_weights()
""")


def test_dump_requested_by_signal_is_parsed(tmp_path):
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", JOB], env=env)
    try:
        path = tmp_path / "agents" / f"faulthandler-{proc.pid}.txt"
        deadline = time.time() + 20
        while not path.exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        threads = faulthandler_dump.request(str(tmp_path / "agents"), proc.pid)
    finally:
        proc.kill()
        proc.wait()
    main = next(t for t in threads if t.thread_id == proc.pid)
    assert [f.function for f in main.frames] == ["wait_for_weights", "<module>"]
    assert any(t.frames and t.frames[0].function == "background_poll" for t in threads)
    assert proc.returncode == -9  # the signal did not kill it: only our SIGKILL did
