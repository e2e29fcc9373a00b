"""The versions a rank runs with, published once for the watcher: the job may run another
interpreter or virtual environment than stalldoc, so the truth is in the ranks.

Packages are read from their installed metadata folders' names, never imported (nor is
``importlib.metadata``, whose imports read over a megabyte the watcher would count as work). torch's
CUDA comes from ``torch.version`` when the process imported torch, else from the text of its
installed ``torch/version.py``; NCCL's only from a torch the process imported itself, through
``torch.cuda.nccl.version()``, which returns the version torch was built with (compile-time
constants in ``torch/csrc/cuda/nccl.cpp``) and initialises no CUDA.

The agent's heartbeat thread calls ``VersionsPublisher.tick`` every beat: one dictionary look-up
until torch finished importing (or ``WAIT_BEATS`` passed), then the file ``versions-<pid>.json``
in the agent directory is written (atomically), and once more if torch is imported later. Standard
library only: this module runs inside every training process.
"""
from __future__ import annotations

import json
import os
import re
import sys

PACKAGES = ("torch", "vllm", "deepspeed", "transformers", "trl", "ms-swift", "stalldoc")
WAIT_BEATS = 40            # 10 s of heartbeats: a process that never imports torch publishes then
FILE_PREFIX = "versions-"
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"\n]{1,32})['\"]", re.M)
_VERSION_FILE_LIMIT = 8192

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def versions_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{pid}.json")


def package_versions(names: tuple[str, ...] = PACKAGES,
                     paths: list[str] | None = None) -> dict[str, str | None]:
    """Each distribution's installed version (None: not installed), the first found on
    ``sys.path`` as ``importlib.metadata`` finds it, from its metadata folder's name
    (``torch-2.13.0+cpu.dist-info``); an ``.egg-info`` without a version in its name gives it
    in its ``PKG-INFO`` (one short read). ``importlib.metadata`` is not used: its own imports
    read over a megabyte of modules, which the watcher would count as this process's I/O."""
    return {name: (found[1] if found else None)
            for name, found in _distributions(names, paths).items()}


def _distributions(names: tuple[str, ...], paths: list[str] | None
                   ) -> dict[str, tuple[str, str] | None]:
    """name -> (the folder on the path that holds it, its version), or None."""
    wanted = {_normal(name): name for name in names}
    out: dict[str, tuple[str, str] | None] = dict.fromkeys(names)
    for folder in sys.path if paths is None else paths:
        try:
            entries = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            name, version = _named(folder or ".", entry)
            key = wanted.get(name)
            if key is not None and out[key] is None and version:
                out[key] = (folder or ".", version)
    return out


def _named(folder: str, entry: str) -> tuple[str, str]:
    """(normalised name, version) of a metadata folder ``entry``; ('', '') when it is none."""
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix):
            name, _, rest = entry[:-len(suffix)].partition("-")
            version = rest.split("-py", 1)[0] if rest else _pkg_info_version(
                os.path.join(folder, entry))
            return _normal(name), version
    return "", ""


def _pkg_info_version(path: str) -> str:
    """The ``Version:`` an ``.egg-info`` folder's PKG-INFO (or the file itself) says."""
    target = os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path
    try:
        with open(target, encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096)
    except OSError:
        return ""
    found = re.search(r"^Version:\s*(\S+)", head, re.M)
    return found.group(1) if found else ""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_torch_cuda(paths: list[str] | None = None) -> str | None:
    """The CUDA version of the installed torch, read from its ``torch/version.py`` as text (no
    import); None when torch is not installed, is a CPU build, or the file says nothing usable."""
    found = _distributions(("torch",), paths)["torch"]
    if found is None:
        return None
    try:
        with open(os.path.join(found[0], "torch", "version.py"), encoding="utf-8") as fh:
            text = fh.read(_VERSION_FILE_LIMIT)
    except OSError:
        return None
    return cuda_in(text)


def cuda_in(text: str) -> str | None:
    """The CUDA version a ``torch/version.py`` names (None: a CPU build)."""
    match = _CUDA_LINE.search(text)
    return match.group(1) if match else None


def imported_torch(modules: dict[str, Any]) -> Any:
    """torch when this process finished importing it, else None (never imports it)."""
    torch = modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    if torch is None or getattr(spec, "_initializing", False):
        return None
    return torch


def nccl_version(torch: Any, modules: dict[str, Any]) -> str | None:
    """NCCL's version torch was built with; only from modules torch already imported."""
    nccl = modules.get("torch.cuda.nccl")
    if nccl is None or not hasattr(getattr(torch, "_C", None), "_nccl_version"):
        return None
    parts = nccl.version()
    return ".".join(str(p) for p in parts[:3]) + (f"-{parts[3]}" if len(parts) > 3 else "")


def collect(modules: dict[str, Any]) -> dict[str, Any]:
    """What this process runs with: Python, the packages, torch's CUDA and NCCL."""
    torch = imported_torch(modules)
    info: dict[str, Any] = {"python": sys.version.split()[0], **package_versions(),
                            "torch_imported": torch is not None}
    if torch is not None:
        info["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        info["nccl"] = nccl_version(torch, modules)
    else:
        info["cuda"] = installed_torch_cuda()
    return info


def publish(directory: str, pid: int, info: dict[str, Any]) -> None:
    """Write ``info`` for the watcher (``write_json``)."""
    write_json(versions_path(directory, pid), info)


def write_json(path: str, info: dict[str, Any]) -> None:
    """``info`` as JSON at ``path``: a temporary file renamed over the last one (mode 0600)."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with open(fd, "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    os.replace(temporary, path)


class VersionsPublisher:
    """Publishes this process's versions once torch is imported (or after ``WAIT_BEATS``
    beats), and again if torch is imported after that; then never looks again."""

    def __init__(self, directory: str, pid: int, modules: dict[str, Any] | None = None) -> None:
        self.directory = directory
        self.pid = pid
        self.modules = sys.modules if modules is None else modules
        self.beats = 0
        self.published = False   # at least once
        self.done = False        # with torch imported: nothing left to learn

    def tick(self) -> None:
        if self.done:
            return
        self.beats += 1
        with_torch = imported_torch(self.modules) is not None
        if with_torch or (not self.published and self.beats >= WAIT_BEATS):
            self.done = with_torch
            self.published = True
            publish(self.directory, self.pid, collect(self.modules))
