"""The relay's handle on the sidecar: starts it in a process group of its own (terminal signals
do not reach it), hands it records through a non-blocking outbox, reads its messages."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import stalldoc
from stalldoc.run.channel import Outbox

SIDECAR_LOG = "sidecar.log"
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
SIDECAR_UMASK = 0o077   # what the sidecar creates (run.db, its -wal and -shm, ...) is ours only;
                        # the job's umask is never touched


class SidecarLink:
    def __init__(self, run_dir: Path, options: dict[str, object],
                 streams: list[tuple[int, int]]) -> None:
        """``streams``: (read end of a job's output, our fd it goes to): the sidecar holds
        copies and relays them itself should the relay be killed, so the job never gets EPIPE."""
        to_sidecar, self._to_w = os.pipe()
        self.inbox, from_sidecar = os.pipe()
        pairs = [(source, os.dup(target)) for source, target in streams]
        fds = [to_sidecar, from_sidecar, *(fd for pair in pairs for fd in pair)]
        takeover = ",".join(f"{source}:{target}" for source, target in pairs)
        try:
            log = os.open(run_dir / SIDECAR_LOG, LOG_FLAGS, 0o600)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "stalldoc.sidecar", str(to_sidecar),
                     str(from_sidecar), takeover], pass_fds=fds, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=log, process_group=0, env=_sidecar_env(),
                    umask=SIDECAR_UMASK)
            finally:
                os.close(log)
        finally:
            for fd in [to_sidecar, from_sidecar, *(target for _, target in pairs)]:
                os.close(fd)
        proc.returncode = 0   # reaped by the relay's waitpid(-1)
        os.set_blocking(self.inbox, False)
        self.pid = proc.pid
        self.outbox = Outbox(self._to_w)
        self.outbox.control("O " + json.dumps(options))
        self.exit_status: int | None = None
        self._pending = b""
        self.inbox_open = True

    def messages(self) -> list[dict[str, object]]:
        """Every complete message the sidecar has written so far; never blocks."""
        data = b""
        while self.inbox_open:
            try:
                chunk = os.read(self.inbox, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.inbox_open = False
                break
            data += chunk
        *lines, self._pending = (self._pending + data).split(b"\n")
        return [m for m in (_decode(line) for line in lines) if m is not None]

    @property
    def alive(self) -> bool:
        return self.exit_status is None

    def close(self) -> None:
        self.outbox.close()
        if self.inbox >= 0:
            try:
                os.close(self.inbox)
            except OSError:
                pass
        self.inbox, self.inbox_open = -1, False


def _decode(line: bytes) -> dict[str, object] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _sidecar_env() -> dict[str, str]:
    """Our environment, with this stalldoc first on the path (it may run from a checkout)."""
    env = dict(os.environ)
    here = str(Path(stalldoc.__file__).resolve().parent.parent)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = here + (os.pathsep + old if old else "")
    return env
