"""Stacks of every rank with py-spy, in parallel; faulthandler is the fallback when ptrace is denied."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stalldoc.errors import PtraceDenied
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack, as_written
from stalldoc.probes import ProbeUnavailable
from stalldoc.probes import faulthandler_dump

DUMP_TIMEOUT = 10.0
_DENIED = ("Permission denied", "Operation not permitted", "ptrace")


def pyspy_binary() -> str:
    """py-spy next to this interpreter (its wheel's script), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    found = beside if os.access(beside, os.X_OK) else shutil.which("py-spy")
    if not found:
        raise ProbeUnavailable("py-spy is not installed (pip install py-spy)")
    return found


def parse_dump(data: list[dict[str, Any]]) -> tuple[ThreadStack, ...]:
    """py-spy's ``dump --json`` threads → ThreadStacks (frames innermost first, as py-spy gives;
    the agent's pass-through wrappers left out)."""
    threads = []
    for item in data:
        frames = as_written(tuple(
            Frame(f.get("name", "?"), f.get("filename", "?"), int(f.get("line") or 0))
            for f in item.get("frames", [])))
        threads.append(ThreadStack(int(item.get("os_thread_id") or item.get("thread_id") or 0),
                                   item.get("thread_name"), bool(item.get("active")),
                                   bool(item.get("owns_gil")), frames))
    return tuple(threads)


def dump_pyspy(pid: int, nonblocking: bool) -> tuple[ThreadStack, ...]:
    """One py-spy dump; raises PtraceDenied or RuntimeError with py-spy's own message."""
    cmd = [pyspy_binary(), "dump", "--pid", str(pid), "--json"]
    if nonblocking:
        cmd.append("--nonblocking")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DUMP_TIMEOUT)
    if proc.returncode != 0:
        text = error_text(proc.stderr or proc.stdout) or f"py-spy exited {proc.returncode}"
        if any(word in text for word in _DENIED):
            raise PtraceDenied(text)
        raise RuntimeError(text)
    return parse_dump(json.loads(proc.stdout))


def error_text(output: str) -> str:
    """py-spy's error and its causes in one line, without the Rust backtrace after them."""
    head = output.split("Stack backtrace:")[0]
    return " ".join(line.strip() for line in head.splitlines() if line.strip())


class StackProbe:
    """Captures the Python stacks of many ranks at once."""

    name = "pyspy"

    def __init__(self, agent_dir: str | None) -> None:
        self.agent_dir = agent_dir
        self.ptrace_denied = ""  # py-spy's words, once it was denied: the fallback is used after

    def capture(self, rank: RankProcess, stopped: bool, nonblocking: bool = False,
                fallback: bool = True) -> RankStacks:
        """One rank's stacks; ``nonblocking`` reads them without pausing the rank (a stopped
        rank is always read so: pausing it would block). The faulthandler fallback (a signal to
        the rank) is used only where py-spy cannot work at all (denied, not installed), never
        for a rank py-spy could not read (it may be starting or ending: the signal would kill
        it), and not at all with ``fallback=False``."""
        now = time.time()
        nonblocking = nonblocking or stopped
        method = "py-spy-nonblocking" if nonblocking else "py-spy"
        try:
            if not self.ptrace_denied:
                return RankStacks(rank.rank, rank.pid, now, method,
                                  dump_pyspy(rank.pid, nonblocking))
        except PtraceDenied as exc:
            self.ptrace_denied = str(exc)
        except ProbeUnavailable as exc:
            return self._fallback(rank, now, str(exc), fallback)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            return RankStacks(rank.rank, rank.pid, now, "none", (), f"py-spy failed: {exc}")
        return self._fallback(rank, now, f"py-spy was denied ({self.ptrace_denied}). "
                                         f"{PtraceDenied.HELP_TEXT}", fallback)

    def _fallback(self, rank: RankProcess, now: float, why: str, allowed: bool) -> RankStacks:
        if not self.agent_dir or not allowed:
            return RankStacks(rank.rank, rank.pid, now, "none", (), why)
        threads = faulthandler_dump.request(self.agent_dir, rank.pid)
        method = "faulthandler" if threads else "none"
        return RankStacks(rank.rank, rank.pid, now, method, threads, why)

    def capture_all(self, ranks: list[RankProcess], stopped: set[int]) -> dict[int, RankStacks]:
        """Every rank in parallel (one py-spy per rank); rank → stacks."""
        if not ranks:
            return {}
        with ThreadPoolExecutor(max_workers=min(32, len(ranks))) as pool:
            results = pool.map(lambda r: self.capture(r, r.pid in stopped), ranks)
            return {stacks.rank: stacks for stacks in results}


class BackgroundStacks:
    """Stack samples of busy ranks taken off the tick: ``request`` only queues one (it never
    waits for py-spy; at most one per process at a time, asking again while one is queued or
    running adds nothing), a bounded pool of workers takes them in parallel, and ``done`` hands
    back those finished since the last call (the next tick applies them). The samples do not
    pause the rank (py-spy --nonblocking) and never signal it (no faulthandler fallback)."""

    def __init__(self, probe: StackProbe, workers: int = 4) -> None:
        self.probe = probe
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stalldoc-stacks")
        self._running: dict[int, Future[RankStacks]] = {}   # pid -> its sample

    def request(self, rank: RankProcess) -> None:
        if rank.pid in self._running:
            return
        self._running[rank.pid] = self._pool.submit(self.probe.capture, rank, False, True, False)

    def done(self) -> list[RankStacks]:
        out = []
        for pid, future in list(self._running.items()):
            if future.done():
                del self._running[pid]
                if future.exception() is None:
                    out.append(future.result())
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
