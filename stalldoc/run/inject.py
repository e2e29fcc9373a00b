"""Prepare the environment that makes every Python process of the job start the agent."""
from __future__ import annotations

import os
from pathlib import Path

import stalldoc
from stalldoc.agent.flight import BUFFER_VARS, ENV_FLIGHT_DIR
from stalldoc.agent.runtime import ENV_AGENT_DIR, ENV_WATCHER_PID
from stalldoc.errors import StalldocError
from stalldoc.private_files import private_subdir, replace_symlink, write_private_file

BOOTSTRAP = Path(__file__).resolve().parent.parent / "agent" / "bootstrap" / "sitecustomize.py"
PACKAGE = Path(stalldoc.__file__).resolve().parent
FLIGHT_DIR = "flight"            # <run dir>/flight/rank_<N>: the layout torchfrtrace reads
FLIGHT_BUFFER_SIZE = "2000"      # entries per process group kept by torch's Flight Recorder
DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


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


def flight_environment(run_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """What turns torch's Flight Recorder on and sends its dumps into the run directory; a
    variable the user set (under its current or its deprecated name) is left alone."""
    flight = run_dir / FLIGHT_DIR
    added = {ENV_FLIGHT_DIR: str(flight)}
    if not any(name in base for name in BUFFER_VARS):
        added[BUFFER_VARS[0]] = FLIGHT_BUFFER_SIZE
    if not any(name in base for name in DUMP_FILE_VARS):
        added[DUMP_FILE_VARS[0]] = str(flight / "rank_")
    return added


def flight_settings(run_dir: Path, base: dict[str, str], enabled: bool) -> dict[str, object]:
    """What the run records about the Flight Recorder: on or off, which settings stalldoc made
    and which the user had made (names only for the user's, values for ours)."""
    if not enabled:
        return {"enabled": False}
    ours = flight_environment(run_dir, base)
    mine = (*BUFFER_VARS, *DUMP_FILE_VARS)
    return {"enabled": True, "dir": ours[ENV_FLIGHT_DIR],
            "set": {k: v for k, v in ours.items() if k != ENV_FLIGHT_DIR},
            "user_set": sorted(k for k in mine if k in base)}


def agent_environment(run_dir: Path, base: dict[str, str], watcher_pid: int,
                      flight_recorder: bool = True) -> dict[str, str]:
    """``base`` plus what the agent needs: the bootstrap first on PYTHONPATH, where to write;
    with ``flight_recorder``, torch's Flight Recorder on and dumping into the run directory."""
    boot = prepare_bootstrap(run_dir)
    try:
        agents = private_subdir(run_dir, "agents")
        if flight_recorder:
            private_subdir(run_dir, FLIGHT_DIR)
    except OSError as exc:
        raise StalldocError(f"cannot prepare the agents' directory in {run_dir}: "
                            f"{exc.strerror or exc}") from exc
    env = dict(base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(boot) + (os.pathsep + old if old else "")
    env[ENV_AGENT_DIR] = str(agents)
    env[ENV_WATCHER_PID] = str(watcher_pid)
    if flight_recorder:
        env.update(flight_environment(run_dir, base))
    return env
