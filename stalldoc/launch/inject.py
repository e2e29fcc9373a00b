"""Prepare the environment that makes every Python process of the job start the agent."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import stalldoc
from stalldoc.agent.runtime import ENV_AGENT_DIR, ENV_WATCHER_PID

BOOTSTRAP = Path(__file__).resolve().parent.parent / "agent" / "bootstrap" / "sitecustomize.py"


def prepare_bootstrap(run_dir: Path) -> Path:
    """A directory with our sitecustomize and a link to this stalldoc package, for PYTHONPATH."""
    boot = run_dir / "bootstrap"
    boot.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(BOOTSTRAP, boot / "sitecustomize.py")
    link = boot / "stalldoc"
    if not link.exists():
        link.symlink_to(Path(stalldoc.__file__).resolve().parent, target_is_directory=True)
    return boot


def agent_environment(run_dir: Path, base: dict[str, str], watcher_pid: int) -> dict[str, str]:
    """``base`` plus what the agent needs: the bootstrap first on PYTHONPATH, where to write."""
    boot = prepare_bootstrap(run_dir)
    agents = run_dir / "agents"
    agents.mkdir(mode=0o700, exist_ok=True)
    env = dict(base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(boot) + (os.pathsep + old if old else "")
    env[ENV_AGENT_DIR] = str(agents)
    env[ENV_WATCHER_PID] = str(watcher_pid)
    return env
