"""Which rank this process is, learned from inside it: the agent's side of rank identity.

Launchers do not all say so in the environment. torchrun, deepspeed and accelerate put ``RANK``
there at exec; Slurm, Open MPI, PMIx, PMI and MVAPICH put their own variables; mp.spawn passes the
rank as an argument, Lightning and Ray Train hand it to ``init_process_group``, and many scripts
set ``os.environ["RANK"]`` themselves just before. The one moment every launcher has in common is
the job creating its default process group: the agent wraps ``init_process_group`` and reads the
rank, world size and the store's address (which world it joined) right after it returns, in the
caller's thread, holding no reference to any group or store afterwards.

Each claim goes into the state file (``statefile.StateWriter.claim``); the watcher prefers the
strongest. Standard library only, and torch is only ever touched through the module it is given.
"""
from __future__ import annotations

import os
import sys

from stalldoc import engines
from stalldoc.agent import statefile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

    Claim = tuple[int, int, int, int, bytes]   # source, rank, local rank, world size, world

# Each rank variable with the local-rank and size variables of the same launcher.
_LAUNCHERS = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_SIZE"),
)
_LOCAL_RANKS = tuple(dict.fromkeys(local for _, local, _ in _LAUNCHERS))
NOTHING: Claim = (0, -1, -1, -1, b"")


def _number(environ: Mapping[str, str], name: str) -> int:
    """The variable as a rank-like number; -1 when absent or not one."""
    try:
        value = int(environ.get(name, ""))
    except ValueError:
        return -1
    return value if 0 <= value < 2**31 else -1


def from_environment(environ: Mapping[str, str]) -> Claim:
    """The claim a process's environment makes: ``RANK`` first, then the first launcher's
    variable present (with that launcher's local rank and size)."""
    for name, local, size in _LAUNCHERS:
        rank = _number(environ, name)
        if rank >= 0:
            return (statefile.CLAIM_SOURCES.index(name), rank, _number(environ, local),
                    _number(environ, size), b"")
    return NOTHING


def local_rank(environ: Mapping[str, str]) -> int:
    """This process's local rank from whichever launcher set one; -1 when none did."""
    for name in _LOCAL_RANKS:
        value = _number(environ, name)
        if value >= 0:
            return value
    return -1


def world_name(text: str) -> bytes:
    """``text`` as the state file's world field: cut to fit, a long one ending in its checksum
    so that two long names stay apart."""
    data = text.encode("utf-8", "replace")
    if len(data) <= statefile.CLAIM_WORLD_SIZE:
        return data
    import zlib   # only for a name longer than the field
    return data[: statefile.CLAIM_WORLD_SIZE - 9] + b"#%08x" % zlib.crc32(data)


def _store_address(c10d: Any) -> str:
    """The default group's store as ``host:port`` (TCPStore) or its path (FileStore); ''."""
    store = c10d._get_default_store()
    for _ in range(8):    # PrefixStores wrap the real one
        inner = getattr(store, "_underlying_non_prefix_store", None) or getattr(
            store, "underlying_store", None)
        if inner is None or inner is store:
            break
        store = inner
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host is not None and port is not None:
        return f"{host}:{port}"
    path = getattr(store, "path", None)
    return f"file:{path}" if path else ""


def _world(dist: Any, init_method: Any) -> str:
    """Which world the default group joined: its store, else the init method or MASTER_*."""
    try:
        address = _store_address(dist.distributed_c10d)
    except Exception:  # noqa: BLE001 - a private API: fall back to what the job said
        address = ""
    if address:
        return address
    if isinstance(init_method, str) and init_method and init_method != "env://":
        return init_method.split("://", 1)[-1]
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{host}:{port}" if host and port else ""


def from_group(dist: Any, init_method: Any = None, engine: str = "") -> Claim:
    """The claim of a process whose default process group exists (``NOTHING`` otherwise);
    ``engine``: the claim source of the rollout engine that created the group for itself
    (``vLLM engine``: the claim of an engine worker), '' for the job's own group."""
    if not dist.is_initialized():
        return NOTHING
    source = statefile.CLAIM_SOURCES.index(engine) if engine else statefile.SOURCE_GROUP
    return (source, dist.get_rank(), local_rank(os.environ), dist.get_world_size(),
            world_name(_world(dist, init_method)))


_ENGINE_FRAMES = 16   # how far up the caller's stack an engine's own code is looked for


def engine_world(init_method: Any, caller: Any) -> str:
    """The claim source of the rollout engine whose own code (a frame of its package among the
    caller's: ``vllm``, ``sglang``) created the group for a world of its own: its workers' TP/PP
    world, reached at an address the engine chose (``tcp://127.0.0.1:PORT``, or a store it
    made); '' when none did. ``env://`` is the job's world: vLLM inside a training rank
    (``external_launcher``) joins the rank's world, and the process stays that rank."""
    if init_method == "env://":
        return ""
    frame, depth = caller, 0
    while frame is not None and depth < _ENGINE_FRAMES:
        engine = engines.by_module(frame.f_globals.get("__name__", ""))
        if engine is not None:
            return engine.claim
        frame, depth = frame.f_back, depth + 1
    return ""


def wrap_init(dist: Any, fn: Callable[..., Any], publish: Callable[[Claim], None]
              ) -> Callable[..., Any]:
    """``init_process_group`` that publishes the rank the job just became; whatever happens
    in the reading, the job's call and its result are untouched."""

    import functools

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        try:
            method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
            publish(from_group(dist, method, engine_world(method, sys._getframe(1))))
        except Exception:  # noqa: BLE001 - identity unknown; the job goes on
            pass
        return result

    functools.update_wrapper(wrapper, fn)
    wrapper.__stalldoc_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper
