"""The build locks of torch C++ extensions that ranks wait on, read at a stall.

torch builds an extension (``torch.utils.cpp_extension.load``: DeepSpeed's ops, custom kernels)
in ``TORCH_EXTENSIONS_DIR/NAME``, else ``$XDG_CACHE_HOME or ~/.cache``
``/torch_extensions/ACCEL/NAME`` (``py311_cu121``, ``py311_cpu``), behind a ``lock`` file there:
one process creates it and builds, every other one sleeps until the file is gone. Each lock file
under the roots of the waiting ranks is found, with its age and the processes working in its
directory: torch runs ninja there, ninja the compilers, each in a process group of its own. With
ninja there, they are the lock's build; without it, they are what is left of a build that was
stopped (``kill -9`` of its process group ends torch and ninja, not the compilers), and they end
without removing the lock. Only ``TORCH_EXTENSIONS_DIR``,
``XDG_CACHE_HOME`` and ``HOME`` are read from a rank's environment.
"""
from __future__ import annotations

import glob
import os
import time
from typing import Iterable

from stalldoc.model.stacks import BuildLock
from stalldoc.probes.proc_table import read_environment

_WANTED = (b"TORCH_EXTENSIONS_DIR", b"XDG_CACHE_HOME", b"HOME")


def build_locks(pids: Iterable[int], proc: str = "/proc", now: float | None = None
                ) -> tuple[BuildLock, ...]:
    """The lock files under the extension roots of ``pids`` (the waiting ranks), oldest
    first."""
    now = time.time() if now is None else now
    paths = sorted({path for root in {extension_root(pid, proc) for pid in pids} if root
                    for path in _locks_under(root)})
    if not paths:
        return ()
    cwds = _working_dirs(proc)
    locks = [_lock(path, round(max(0.0, now - mtime), 1), cwds, proc)
             for path, mtime in ((p, _mtime(p)) for p in paths) if mtime is not None]
    return tuple(sorted(locks, key=lambda lock: -lock.age))


def _lock(path: str, age: float, cwds: dict[int, str], proc: str) -> BuildLock:
    """The lock with the processes in its directory: its builders while ninja is one of them,
    else the leftovers of a stopped build."""
    inside = tuple(sorted(pid for pid, cwd in cwds.items() if cwd == os.path.dirname(path)))
    if any(_command(pid, proc) == "ninja" for pid in inside):
        return BuildLock(path, age, inside)
    return BuildLock(path, age, (), leftovers=inside)


def _command(pid: int, proc: str) -> str | None:
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def extension_root(pid: int, proc: str = "/proc") -> str | None:
    """Where the process builds its extensions (torch's rule), None when unreadable."""
    env = read_environment(pid, _WANTED, proc)
    if env is None:
        return None
    if env.get(b"TORCH_EXTENSIONS_DIR"):
        return os.fsdecode(env[b"TORCH_EXTENSIONS_DIR"])
    cache = env.get(b"XDG_CACHE_HOME") or (env[b"HOME"] + b"/.cache" if env.get(b"HOME")
                                            else None)
    return os.path.join(os.fsdecode(cache), "torch_extensions") if cache else None




def _locks_under(root: str) -> list[str]:
    """``ROOT/NAME/lock`` (TORCH_EXTENSIONS_DIR) and ``ROOT/ACCEL/NAME/lock`` (the default)."""
    pattern = glob.escape(root)
    return [p for depth in ("*", "*/*") for p in glob.glob(f"{pattern}/{depth}/lock")
            if os.path.isfile(p)]


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:   # released since it was listed
        return None


def _working_dirs(proc: str) -> dict[int, str]:
    """Each readable process's working directory."""
    cwds = {}
    for entry in os.listdir(proc):
        if entry.isdigit():
            try:
                cwds[int(entry)] = os.readlink(f"{proc}/{entry}/cwd")
            except OSError:
                continue
    return cwds
