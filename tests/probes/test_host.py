from __future__ import annotations

import os
import subprocess
import sys
import time

from stalldoc.model import RankProcess
from stalldoc.probes.host import HostProbe


def test_live_rank_sampled_with_cpu_percent_and_zombie_left_out():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while True:  # wait until it is a zombie (exited, not reaped)
            with open(f"/proc/{dead.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        probe = HostProbe()
        ranks = [RankProcess(0, busy.pid, 0, ()), RankProcess(1, dead.pid, 1, ())]
        first = probe.sample(time.time(), ranks)
        time.sleep(0.5)
        [second] = probe.sample(time.time(), ranks)
        assert [s.rank for s in first] == [0] and first[0].cpu_percent is None
        assert second.rank == 0 and second.rss_bytes > 0 and second.cpu_percent > 50
        node = probe.node(time.time())
        assert node.total_bytes >= node.available_bytes > 0 and node.cores == os.cpu_count()
    finally:
        busy.kill()
        busy.wait()
        dead.wait()
