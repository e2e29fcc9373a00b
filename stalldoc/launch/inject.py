"""Prepare the environment that makes every Python process of the job start the agent."""
from __future__ import annotations

import os
from pathlib import Path

import stalldoc
from stalldoc.agent.runtime import ENV_AGENT_DIR, ENV_WATCHER_PID
from stalldoc.errors import StalldocError
from stalldoc.launch.rundir import private_subdir, replace_symlink, write_private_file

BOOTSTRAP = Path(__file__).resolve().parent.parent / "agent" / "bootstrap" / "sitecustomize.py"
PACKAGE = Path(stalldoc.__file__).resolve().parent


def prepare_bootstrap(run_dir: Path) -> Path:
    """A directory with our sitecustomize and a link to this stalldoc package, for PYTHONPATH.
    Nothing already at those names is followed: each is replaced (files 0600, directories
    0700). Its ``__pycache__`` is made here, 0700, so the job's interpreter does not make it
    under the job's umask (the bytecode it writes there takes the source's mode, 0600)."""
    try:
        boot = private_subdir(run_dir, "bootstrap")
        private_subdir(boot, "__pycache__")
        write_private_file(boot, "sitecustomize.py", BOOTSTRAP.read_bytes())
        replace_symlink(boot, "stalldoc", PACKAGE)
    except OSError as exc:
        raise StalldocError(f"cannot prepare the agent's bootstrap in {run_dir}: "
                            f"{exc.strerror or exc}") from exc
    return boot


def agent_environment(run_dir: Path, base: dict[str, str], watcher_pid: int) -> dict[str, str]:
    """``base`` plus what the agent needs: the bootstrap first on PYTHONPATH, where to write."""
    boot = prepare_bootstrap(run_dir)
    try:
        agents = private_subdir(run_dir, "agents")
    except OSError as exc:
        raise StalldocError(f"cannot prepare the agents' directory in {run_dir}: "
                            f"{exc.strerror or exc}") from exc
    env = dict(base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(boot) + (os.pathsep + old if old else "")
    env[ENV_AGENT_DIR] = str(agents)
    env[ENV_WATCHER_PID] = str(watcher_pid)
    return env
