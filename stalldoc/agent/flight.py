"""Flight Recorder dumps on the watcher's request, from the agent's heartbeat thread.

The watcher asks by replacing ``<agents dir>/flight-request``; each beat costs one ``stat`` of
it (and nothing at all until torch.distributed is imported). On a new request a rank whose
default process group is up writes torch's own dump, ``_dump_fr_trace()``, to
``<flight dir>/rank_<global rank>`` (temporary file, then rename; mode 0600): the name torch gives
its own dumps, so ``torchfrtrace <flight dir>`` reads the folder. Standard library only; torch is
only reached through ``sys.modules``. A failure switches the dumps off, never the agent.

Python frames: torch 2.13 symbolizes them through ``torch._inductor``, which the first dump with
frames imports (about 800 modules, ~1 s with the GIL held and ~70 MiB in every rank). So a dump
holds frames only where ``torch._inductor`` is already imported (torch.compile users) or
``STALLDOC_FLIGHT_STACKS=1``; otherwise it is taken without them (well under 1 ms) and the
watcher's py-spy stacks tell where the waiting ranks are.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENV_FLIGHT_DIR = "STALLDOC_FLIGHT_DIR"
ENV_FLIGHT_STACKS = "STALLDOC_FLIGHT_STACKS"   # 1: always with Python frames, 0: never
REQUEST_FILE = "flight-request"
READY_FILE = "flight-{pid}"   # in the agents dir: this process can answer a request
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def recorder_on(environ: Any = os.environ) -> bool:
    """Whether torch records: a buffer size above 0 under either of its names."""
    for name in BUFFER_VARS:
        value = environ.get(name)
        if value is not None:
            try:
                return int(value) > 0
            except ValueError:
                return False
    return False


class FlightDumper:
    """Polls the request file; answers each new request with one dump of this rank."""

    def __init__(self, agent_dir: str, flight_dir: str) -> None:
        self.request = os.path.join(agent_dir, REQUEST_FILE)
        self.flight_dir = flight_dir
        self.seen = self._stamp()   # a request made before this process started is not ours

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.request)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def poll(self) -> bool:
        """One beat: dump if a new request came. True when a dump was written."""
        if "torch.distributed" not in sys.modules:
            return False
        stamp = self._stamp()
        if stamp is None or stamp == self.seen:
            return False
        self.seen = stamp
        return self.dump()

    def dump(self) -> bool:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not recorder_on() or not dist.is_available() \
                or not dist.is_initialized():
            return False
        rank = dist.get_rank()
        data = dist_dump(sys.modules["torch"], dist, with_stacks())
        write_atomic(self.flight_dir, f"rank_{rank}", data)
        return True


def with_stacks(environ: Any = os.environ) -> bool:
    """Whether the dump holds Python frames (see the module's docstring)."""
    asked = environ.get(ENV_FLIGHT_STACKS)
    if asked in ("0", "1"):
        return asked == "1"
    return "torch._inductor" in sys.modules


def _raw_dump(c10d: Any, dist: Any, stacks: bool) -> bytes:
    """NCCL keeps its own recorder (CUDA builds have ``_dump_nccl_trace``); gloo and the rest
    record into the one ``_dump_fr_trace`` reads."""
    nccl = getattr(c10d, "_dump_nccl_trace", None)
    if nccl is not None and "nccl" in str(dist.get_backend()).lower():
        try:
            return nccl(True, stacks, False)   # includeCollectives, includeStackTraces, onlyActive
        except Exception:  # noqa: BLE001 - an older signature: the generic dump below
            pass
    return c10d._dump_fr_trace(includeStackTraces=stacks)


def dist_dump(torch: Any, dist: Any, stacks: bool = True) -> bytes:
    """torch's dump of this process; its group table filled in from torch.distributed when
    torch listed a group under no name (torch 2.13 gloo: recorded before the group is named),
    which torchfrtrace could not match with the entries."""
    data = _raw_dump(torch._C._distributed_c10d, dist, stacks)
    raw = _loads(data)   # our own process's bytes, made by torch just now
    config = raw.get("pg_config")
    named = {e["process_group"][0] for e in raw.get("entries", ())
             if isinstance(e.get("process_group"), (tuple, list))}
    if not isinstance(config, dict) or named <= set(config):
        return data
    fixed = {k: v for k, v in config.items() if k}
    for group in dist.distributed_c10d._get_all_pg_configs():
        fixed.setdefault(str(group["pg_name"]), {"name": str(group["pg_name"]),
                                                 "desc": str(group["pg_desc"]),
                                                 "ranks": str(list(group["ranks"]))})
    raw["pg_config"] = fixed
    import pickle
    return pickle.dumps(raw)


def _loads(data: bytes) -> Any:
    """Unpickle with the collector paused: the ~40k small objects of a 2000-entry dump would
    otherwise set off full collections over the job's heap (95 ms instead of 4 ms)."""
    import gc
    import pickle   # here: only a process that dumps pays for the import
    was_on = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(data)
    finally:
        if was_on:
            gc.enable()


def write_atomic(directory: str, name: str, data: bytes) -> None:
    """``directory/name`` replaced by ``data`` in one rename, mode 0600, through no link. The
    temporary name holds no ``rank_`` so torchfrtrace never mistakes it for a dump."""
    temp = os.path.join(directory, f".partial-{os.getpid()}")
    try:
        os.unlink(temp)
    except FileNotFoundError:
        pass
    fd = os.open(temp, _WRITE_FLAGS, 0o600)
    try:
        with open(fd, "wb", closefd=True) as fh:
            fh.write(data)
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def from_env(agent_dir: str) -> FlightDumper | None:
    """A dumper when the watcher asked for Flight Recorder dumps (``STALLDOC_FLIGHT_DIR``) and
    torch records; an empty ``flight-<pid>`` in the agents dir tells the watcher to wait for
    this process's dump."""
    flight_dir = os.environ.get(ENV_FLIGHT_DIR)
    if not flight_dir or not recorder_on():
        return None
    dumper = FlightDumper(agent_dir, flight_dir)
    os.close(os.open(os.path.join(agent_dir, READY_FILE.format(pid=os.getpid())),
                     os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    return dumper
