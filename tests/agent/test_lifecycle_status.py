"""Where a rank is in its life, as its agent publishes it around ``destroy_process_group()``:
running, inside it (teardown), past it (left its world: its distributed work is over), and
running again when it joins a world anew (real processes under the real agent, gloo)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stalldoc.agent import statefile
from stalldoc.run.inject import agent_environment
from support import free_port

LIFE = """
import os, torch.distributed as dist
from stalldoc.agent.state_reader import read_state
mine = os.path.join(os.environ["STALLDOC_TEST_AGENTS"], f"agent-{os.getpid()}.state")
def status(when):
    print(when, read_state(mine).status, flush=True)
def join(port):
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
join(PORT1)
status("running")
dist.destroy_process_group()
status("left")
join(PORT2)
status("joined again")
dist.destroy_process_group()
status("left again")
"""


def test_the_agent_says_when_a_rank_has_left_its_world(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    code = LIFE.replace("PORT1", str(free_port())).replace("PORT2", str(free_port()))
    env = agent_environment(tmp_path / "run", {**os.environ, "OMP_NUM_THREADS": "1",
                                               "STALLDOC_TEST_AGENTS": str(tmp_path / "run" /
                                                                           "agents")},
                            os.getpid())
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    seen = dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())
    assert {when: int(s) for when, s in seen.items()} == {
        "running": statefile.STATUS_RUNNING, "left": statefile.STATUS_LEFT,
        "joined again": statefile.STATUS_RUNNING,
        "left again": statefile.STATUS_LEFT}
