"""What ``stalldoc watch`` was asked to do, and its run directory."""
from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, fields
from pathlib import Path

from stalldoc.errors import StalldocError

DEFAULT_STALL_TIMEOUT = 45.0
DEFAULT_BUSY_TIMEOUT = 600.0


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
    """The run directory (mode 0700): the one asked for, or ./stalldoc-runs/<UTC time>-<id>."""
    if requested is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        requested = Path("stalldoc-runs") / f"{stamp}-{secrets.token_hex(3)}"
    try:
        requested.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(requested, 0o700)
        if any(requested.iterdir()):
            raise StalldocError(f"run directory is not empty: {requested}")
    except OSError as exc:
        raise StalldocError(f"cannot create run directory {requested}: {exc.strerror}") from exc
    return requested.resolve()
