"""What ``stalldoc watch`` was asked to do, and its run directory."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, fields
from pathlib import Path

from stalldoc.launch.rundir import make_private_dir

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

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> WatchOptions:
        """The options as the relay handed them to the sidecar."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["argv"] = tuple(values.get("argv") or ())   # type: ignore[arg-type]
        if values.get("run_dir") is not None:
            values["run_dir"] = Path(str(values["run_dir"]))
        return cls(**values)   # type: ignore[arg-type]


def make_run_dir(requested: Path | None) -> Path:
    """The run directory, mode 0700, where no other user can redirect it (``launch/rundir.py``):
    the one asked for, or ./stalldoc-runs/<UTC time>-<id>. Its resolved path."""
    if requested is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        requested = Path(DEFAULT_RUNS) / f"{stamp}-{secrets.token_hex(3)}"
    return make_private_dir(requested)
