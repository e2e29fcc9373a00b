"""``stalldoc attach``: observe a job stalldoc did not start, diagnose it, store the run.

The watcher of ``stalldoc watch`` (``watch.Watcher``) does the observing, with an ``AttachLink``
instead of the relay and without the agent: every tick samples the ranks' CPU, I/O and memory
from /proc and classifies busy ranks' stacks (py-spy ``--nonblocking``). The one-shot look lasts
``window`` seconds: when no rank showed work in it, the stall is declared and diagnosed (one
py-spy dump per rank, all in parallel, and the rules that need no agent); otherwise the job is
working, and one non-blocking stack per rank says where each is. ``follow`` then keeps watching
with the stall timeout until the job ends or attach is interrupted.

Nothing here signals the job: the stack probe has no agent directory, so its faulthandler
fallback (a signal) can never fire; no Flight Recorder request, no SIGSTOP, no kill.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Callable, TextIO, cast

from stalldoc.attach.link import AttachLink
from stalldoc.attach.log_tail import LogTail
from stalldoc.attach.target import Target, find_target, job_tree
from stalldoc.attach.verdict import ENDED, STALLED, UNOBSERVED, WORKING, Look, verdict_line
from stalldoc.run.options import DEFAULT_BUSY_TIMEOUT, WatchOptions, make_run_dir
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import RankWork
from stalldoc.probes.proc_table import scan
from stalldoc.redact import redact_argv
from stalldoc.sidecar.link import RelayLink
from stalldoc.sidecar.watcher import Watcher

DEFAULT_WINDOW = 5.0
DEFAULT_INTERVAL = 0.5


@dataclass(frozen=True)
class AttachOptions:
    pids: tuple[int, ...]
    run_dir: Path | None = None
    window: float = DEFAULT_WINDOW
    stall_timeout: float = 45.0        # --follow: a later stall, as in watch
    interval: float = DEFAULT_INTERVAL
    log: Path | None = None
    follow: bool = False
    gpus: bool = True


def attach(options: AttachOptions, out: TextIO = sys.stdout) -> int:
    """Find the job, observe it, print and store the diagnosis; 0 (errors raise
    StalldocError: one line, its exit code)."""
    target = find_target(options.pids)
    log = LogTail(options.log) if options.log is not None else None
    run_dir = make_run_dir(options.run_dir)
    return Session(options, target, run_dir, log, out).run()


class Session:
    """One attach: the watcher, the look, the verdict, --follow, the stored run."""

    def __init__(self, options: AttachOptions, target: Target, run_dir: Path,
                 log: LogTail | None, out: TextIO) -> None:
        self.opts, self.target, self.log, self.out = options, target, log, out
        self.link = AttachLink(out, target.roots[0], time.time())
        busy = max(DEFAULT_BUSY_TIMEOUT, 2 * options.stall_timeout)
        self.watch_options = WatchOptions(
            target.argv, run_dir, options.window, options.interval, agent=False,
            gpus=options.gpus, busy_timeout=busy, flight_recorder=False)
        self.watcher = Watcher(self.watch_options, cast(RelayLink, self.link))
        # never a signal to the job: no faulthandler fallback, no Flight Recorder request
        self.watcher.stack_probe.agent_dir = None
        self.watcher.flight = None
        self.watcher.job = job_tree(target.roots, scan(), os.getpid())
        self.started_at = self.link.job_started_at
        self.job = f"pid {target.roots[0]} ({_name(target.argv)})"

    def run(self) -> int:
        watcher = self.watcher
        stop = _interruptible()
        try:
            self._start()
            look = self._look()
            self._say(self._verdict(look))
            if self.opts.follow and look.outcome not in (ENDED, UNOBSERVED):
                self._follow()
        except KeyboardInterrupt:
            self._say("interrupted: attach detaches (the job runs on)")
        finally:
            stop()
            self._finish()
        self._say(f"run directory {watcher.run_dir} (stalldoc report {watcher.run_dir})")
        return 0

    # ----- the steps --------------------------------------------------------------------------
    def _start(self) -> None:
        watcher, target = self.watcher, self.target
        watcher.started_at = self.started_at
        watcher.store.start_run(watcher.run_dir.name, list(target.argv), socket.gethostname(),
                                self.started_at,
                                self.opts.stall_timeout if self.opts.follow else self.opts.window,
                                False)
        self._store_attached(job_ended=None)
        watcher.store.set_meta("versions", json.dumps(watcher.versions.initial()))
        self._say(f"attached to {self.job}, started {time.ctime(target.started_at)}; "
                  f"{len(target.ranks)} rank(s); observing for {self.opts.window:.0f} s")
        if target.missing:
            self._say(f"its ranks' LOCAL_WORLD_SIZE is {target.local_world_size} but "
                      f"{target.missing} rank(s) are not under {self.job} (ended, or started "
                      f"by another launcher: give their pids too)")
        for probe, why in watcher.sampler.unavailable.items():
            watcher.store.probe_unavailable(probe, why)
        if self.log is not None:
            for line in self.log.tail():
                self.link.line(line)
            watcher._drain_logs()   # before the first tick: old lines are no work of now

    def _look(self) -> Look:
        """Tick until a stall is declared (no rank showed work for ``window`` s), the window
        passed without one, or the job ended."""
        watcher, interval = self.watcher, self.opts.interval
        first = time.time()
        deadline = first + self.opts.window + 2 * interval
        worked: dict[int, RankWork] = {}
        while True:
            now = time.time()
            watcher._safe_tick(now)
            worked.update(_worked_now(watcher, now))
            seconds = now - first
            if watcher.tracker.episode is not None:   # no work for more than the window
                return Look(STALLED, self.opts.window, self._ranks(), {})
            if watcher._job_gone():
                return Look(ENDED, seconds, self._ranks(), worked)
            if now >= deadline:
                last = watcher.tracker.work()
                return Look(WORKING if last else UNOBSERVED, seconds, self._ranks(), worked,
                            last)
            time.sleep(max(0.0, now + interval - time.time()))

    def _ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.watcher.ranks))

    def _verdict(self, look: Look) -> str:
        findings = [e.finding for e in self.watcher.ledger.open_entries("stall")]
        stacks = self.watcher.stall_stacks if look.outcome == STALLED else \
            self._where(look) if look.outcome == WORKING else {}
        return verdict_line(look, self.job, findings, stacks)

    def _where(self, look: Look) -> dict[int, RankStacks]:
        """One stack per live rank, without pausing it, to say where each is."""
        live = [r for r in self.watcher.ranks.values() if not self.watcher.exits.ended(r)]
        if not live:
            return {}
        probe = self.watcher.stack_probe

        def one(rank: RankProcess) -> RankStacks:
            return probe.capture(rank, stopped=False, nonblocking=True, fallback=False)
        with ThreadPoolExecutor(max_workers=min(32, len(live))) as pool:
            return {s.rank: s for s in pool.map(one, live)}

    def _follow(self) -> None:
        """Keep watching, like ``watch`` without the agent, until the job's tree is empty."""
        watcher = self.watcher
        watcher.opts = dataclasses.replace(self.watch_options,
                                           stall_timeout=self.opts.stall_timeout)
        watcher.tracker.floor = self.opts.stall_timeout
        self._say(f"following {self.job} (stall timeout {self.opts.stall_timeout:.0f} s); "
                  f"Ctrl-C detaches")
        if self.log is not None:
            self.log.follow(self.link.line)
        watcher._loop()
        self._say(f"the ranks of {self.job} ended")

    def _finish(self) -> None:
        if self.log is not None:
            self.log.close()
        ended = not self.watcher.job.descendants(exclude=os.getpid())
        self._store_attached(job_ended=ended)
        self.watcher._finish(None)

    def _store_attached(self, job_ended: bool | None) -> None:
        target, opts = self.target, self.opts
        self.watcher.store.set_meta("attached", json.dumps({
            "pids": list(target.given), "roots": list(target.roots),
            "job_started_at": target.started_at, "window_s": opts.window,
            "follow": opts.follow, "stall_timeout_s": opts.stall_timeout if opts.follow else None,
            "log": redact_argv([str(opts.log)])[0] if opts.log is not None else None,
            "detached_at": time.time() if job_ended is not None else None,
            "job_ended": job_ended}))

    def _say(self, message: str) -> None:
        self.watcher.say(message)


def _worked_now(watcher: Watcher, now: float) -> dict[int, RankWork]:
    """The ranks whose evidence at this tick is work (or busy, not yet classified), not a
    verdict held over from an earlier tick."""
    states = watcher.tracker.ranks
    return {r: w for r, w in watcher.tracker.work().items()
            if w.t == now and r in states and states[r].last_work == now
            and w.verdict in ("work", "pending") and (w.verdict == "pending"
                                                      or states[r].last_confirmed == now)}


def _name(argv: tuple[str, ...]) -> str:
    """The launcher's name for the user: 'torchrun', 'swift rlhf', 'train.py'."""
    words = [os.path.basename(w) for w in argv[:4]]
    if words and words[0].startswith("python"):
        words = words[2:] if words[1:2] == ["-m"] else words[1:]
    if len(words) > 1 and not words[1].startswith("-") and "=" not in words[1]:
        return f"{words[0]} {words[1]}"
    return words[0] if words else "?"


def _interruptible() -> Callable[[], None]:
    """SIGTERM ends attach like Ctrl-C (the run is stored); returns the restorer."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:   # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)
