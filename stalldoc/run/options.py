"""What ``stalldoc watch`` was asked to do, and its run directory."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, fields
from pathlib import Path

from stalldoc.errors import StalldocError
from stalldoc.run.nodes import NodeIdentity
from stalldoc.run.rundir import make_private_dir
from stalldoc.store.schema import DB_NAME

DEFAULT_STALL_TIMEOUT = 45.0
DEFAULT_BUSY_TIMEOUT = 600.0
DEFAULT_RUNS = "stalldoc-runs"


@dataclass(frozen=True)
class WatchOptions:
    argv: tuple[str, ...]
    run_dir: Path | None = None
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    interval: float = 1.0
    on_stall: str = "observe"
    agent: bool = True
    kill_grace: float = 10.0
    gpus: bool = True
    strict: bool = False
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    end_detached: bool = False
    flight_recorder: bool = True   # turn torch's Flight Recorder on; dump it on a stall
    shared_dir: Path | None = None  # a multi-node job's run directory, holding every node's
    node: str = ""                  # this node's subdirectory of it (the run directory)
    node_index: int | None = None
    nnodes: int | None = None
    attempt: int = 1                # a requeue of the run in this directory: its attempt

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> WatchOptions:
        """The options as the relay handed them to the sidecar."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["argv"] = tuple(values.get("argv") or ())   # type: ignore[arg-type]
        for key in ("run_dir", "shared_dir"):
            if values.get(key) is not None:
                values[key] = Path(str(values[key]))
        return cls(**values)   # type: ignore[arg-type]


def make_run_dir(requested: Path | None, requeue: bool = False) -> Path:
    """The run directory, mode 0700, where no other user can redirect it (``run/rundir.py``):
    the one asked for, or ./stalldoc-runs/<UTC time>-<id>. Its resolved path. ``requeue``: the
    job runs again, a run already there is set aside."""
    return make_private_dir(_default(requested), requeue=requeue)


def make_node_run_dir(requested: Path | None, node: NodeIdentity, requeue: bool = False
                      ) -> tuple[Path, Path | None]:
    """(the run directory, the shared one or None). A node of a multi-node job given
    ``--run-dir DIR`` writes DIR/<node name>: DIR is shared by the nodes' watchers (made by
    whichever comes first); the node subdirectory must be new or empty, so two watchers that
    call themselves the same node are refused. Anything else: ``make_run_dir``."""
    if requested is None or not node.multi:
        return make_run_dir(requested, requeue), None
    shared = make_private_dir(requested, shared=True)
    if (shared / DB_NAME).exists():
        raise StalldocError(f"run directory {shared} holds the run of a single node; give the "
                            "nodes of this job a new directory")
    return make_private_dir(shared / node.name, requeue=requeue), shared


def _default(requested: Path | None) -> Path:
    if requested is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        requested = Path(DEFAULT_RUNS) / f"{stamp}-{secrets.token_hex(3)}"
    return requested
