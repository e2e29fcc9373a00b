"""The versions a run ran with, for ``meta.versions``: what a rank's agent published
(``agent/versions.py``), else stalldoc's own environment, and the NVIDIA driver from NVML.

Read by the sidecar, which never imports torch, vLLM or DeepSpeed: packages come from their
metadata. A rank's file is the job's, so it is read like a state file: a regular file, not a link,
never waiting, at most ``MAX_BYTES``, and only version-shaped strings under known names are kept.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from stalldoc.agent.versions import PACKAGES, installed_torch_cuda, package_versions, versions_path
from stalldoc.model.ranks import RankProcess

MAX_BYTES = 4096
KEYS = ("python", *PACKAGES, "cuda", "nccl")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_~-]{0,63}")


@dataclass(frozen=True)
class Published:
    """What one rank's agent published: version by name (None: not installed or not known)."""

    rank: int
    values: Mapping[str, str | None]
    torch_imported: bool


@dataclass
class RunVersions:
    """Chooses the versions to store: the lowest rank that published after importing torch,
    else (at the end) the lowest that published at all, else stalldoc's own environment."""

    directory: str | None
    driver: str | None = None
    final_found: bool = False
    _watcher: dict[str, str] | None = field(default=None, repr=False)

    def watcher(self) -> dict[str, str]:
        """stalldoc's own environment (computed once)."""
        if self._watcher is None:
            found = {"python": sys.version.split()[0], **package_versions(),
                     "cuda": installed_torch_cuda()}
            self._watcher = {k: v for k, v in found.items() if v}
        return self._watcher

    def initial(self) -> dict[str, str]:
        """What to store before any rank published."""
        return self._document(None)

    def update(self, ranks: Iterable[RankProcess], final: bool = False) -> dict[str, str] | None:
        """The versions to store now, or None when nothing new: a rank's once one published
        with torch imported, and whatever is best at the ``final`` look."""
        if self.final_found or self.directory is None:
            return None
        best = best_published(self.directory, ranks)
        if best is not None and best.torch_imported:
            self.final_found = True
            return self._document(best)
        return self._document(best) if final else None

    def _document(self, rank: Published | None) -> dict[str, str]:
        if rank is None:
            out = dict(self.watcher())
            out["source"] = "watcher (no rank published its versions; stalldoc's environment)"
        else:
            out = {k: v for k, v in rank.values.items() if v}
            borrowed = [k for k in KEYS if k not in rank.values and k in self.watcher()]
            out.update({k: self.watcher()[k] for k in borrowed})
            notes = ([] if rank.torch_imported else ["before it imported torch"]) + (
                [f"watcher: {', '.join(borrowed)}"] if borrowed else [])
            out["source"] = f"rank {rank.rank}" + (f" ({'; '.join(notes)})" if notes else "")
        if self.driver:
            out["driver"] = self.driver
        return out


def best_published(directory: str, ranks: Iterable[RankProcess]) -> Published | None:
    """The lowest rank that published with torch imported, else the lowest that published."""
    first: Published | None = None
    for rank in sorted(ranks, key=lambda r: (r.rank, r.pid)):
        found = read_published(directory, rank.pid, rank.rank)
        if found is not None and found.torch_imported:
            return found
        first = first or found
    return first


def read_published(directory: str, pid: int, rank: int) -> Published | None:
    """A rank's published versions; None when absent or not an agent's."""
    try:
        data = json.loads(_read(versions_path(directory, pid)))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    values = {k: _version(data[k]) for k in KEYS if k in data}
    return Published(rank, values, data.get("torch_imported") is True)


def _version(value: Any) -> str | None:
    return value if isinstance(value, str) and _VERSION.fullmatch(value) else None


def _read(path: str) -> bytes:
    """At most ``MAX_BYTES`` of a regular file that is no link, never blocking (a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise ValueError("not a regular file") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError("too large")
    return data
