"""SD116 extension-build-lock."""
from __future__ import annotations

import os
from typing import Iterator

from stalldoc.analysis.stacks import waits_on_build_lock
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.stacks import BuildLock
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, describe, join_ranks, rank_evidence

_BUILDING_FIX = ("Another process is building this extension; the ranks go on when its build "
                 "ends. If that build is another job's, give each job its own "
                 "`TORCH_EXTENSIONS_DIR`, or build the ops once before the jobs start.")


class ExtensionBuildLock(Rule):
    """Ranks sleep on the lock of a torch C++ extension build that nobody is building.

    What it does
        At a stall, looks for ranks whose main thread waits in torch's ``FileBaton.wait``
        (``torch.utils.cpp_extension.load``: DeepSpeed's JIT-built ops, custom kernels) and
        reads the ``lock`` files in their extension root (``TORCH_EXTENSIONS_DIR``, else
        ``~/.cache/torch_extensions``): each one's age and the processes working in its build
        directory (torch runs ninja there). With a lock and no ninja building, the lock was
        left by a build that was stopped (an error), even while that build's compilers still
        run there: ninja starts them in process groups of their own, a ``kill -9`` of the job's
        group leaves them, and they end without removing the lock. With ninja running, the
        ranks wait for its build (a warning, another job's build most of the time: this job's
        own builder works and is no stall).

    Why is this bad?
        torch's build lock is a plain file that only the builder removes. A build killed
        mid-way (Ctrl-C, a job's time limit, an OOM kill, a node restart) leaves it behind, and
        from then on every process that loads the extension sleeps on it for good, with no
        message after ``Using ... as PyTorch extensions root...``: every later run of the job
        hangs at start-up until someone deletes the file.

    Evidence
        the waiting ranks, the frame that loads the extension, the user frame, each lock file
        (path, age in seconds, pids building in its directory, pids left there by a stopped
        build), seconds without progress.

    Fix
        Check that no ninja builds in the extension's directory (compilers a stopped build left
        end by themselves), then delete the `lock` file named here (or the extension's
        directory, rebuilt on the next start) and start the job again. To avoid it, build the
        ops ahead (`DS_BUILD_OPS=1 pip install deepspeed`, or load them once before the job
        starts), and give each job its own `TORCH_EXTENSIONS_DIR`.

    References
        OpenRLHF issue #208 (multi-node SFT stuck after "Using .cache/torch_extensions/py310_cu118
        as PyTorch extensions root"), pytorch/pytorch issue #59146 (a stale lock in
        ``cpp_extension``), openvinotoolkit/nncf issues #533 and #1033 (an interrupted build hangs
        every later import), sgl-project/sglang pull request #35989 (stale extension locks hung
        CI runners).
    """

    code = "SD116"
    name = "extension-build-lock"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        waiting = {rank: frame for rank, stacks in sorted(window.stacks.items())
                   if (frame := waits_on_build_lock(stacks.main)) is not None}
        if not waiting:
            return
        ranks = sorted(waiting)
        first = ranks[0]
        locks = window.build_locks
        building = [lock for lock in locks if lock.builders]
        evidence = {**rank_evidence(window, first), "loader": str(waiting[first]),
                    "locks": [{"path": lock.path, "age": lock.age,
                               "builders": list(lock.builders),
                               "leftovers": list(lock.leftovers)} for lock in locks]}
        verb = "waits" if len(ranks) == 1 else "wait"
        summary = (f"{join_ranks(ranks)} {verb} for "
                   f"{_what(locks, building)}; loaded from {waiting[first]}, "
                   f"{describe(window, first)}")
        if building and len(building) == len(locks):
            yield self.finding(ranks, summary, evidence, fix=_BUILDING_FIX,
                               severity=Severity.WARNING)
        else:
            yield self.finding(ranks, summary, evidence)


def _what(locks: tuple[BuildLock, ...], building: list[BuildLock]) -> str:
    """What the ranks wait for, in words, from the lock files found."""
    if not locks:
        return ("the build lock of a torch C++ extension (FileBaton.wait), not found under their "
                "extension root")
    if building and len(building) == len(locks):
        return "; ".join(f"the build of torch C++ extension {_name(lock)} by pid(s) "
                         f"{', '.join(map(str, lock.builders))} (lock {lock.path}, "
                         f"written {_age(lock.age)} ago)" for lock in building)
    stale = [lock for lock in locks if not lock.builders]
    said = "; ".join(f"{lock.path} (written {_age(lock.age)} ago{_leftovers(lock)})"
                     for lock in stale)
    names = ", ".join(_name(lock) for lock in stale)
    one = len(stale) == 1
    return (f"the build lock of torch C++ extension{'' if one else 's'} {names}, which no "
            f"process is building: left by a build that was stopped; "
            f"{'its lock is' if one else 'one of'} {said}")


def _leftovers(lock: BuildLock) -> str:
    """The processes a stopped build left in the lock's directory, in words."""
    if not lock.leftovers:
        return ""
    return (f"; its compilers still run there, pid(s) {', '.join(map(str, lock.leftovers))}, "
            "with no ninja, and end without removing it")


def _name(lock: BuildLock) -> str:
    return os.path.basename(os.path.dirname(lock.path))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"
