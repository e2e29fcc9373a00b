"""The process the user's shell waits on: a small relay that never lets stalldoc harm the job.

It starts the sidecar (probes, py-spy, rules, SQLite, metrics: everything that can fail), waits
for its launch checks, starts the job in a process group of its own in our session, forwards
signals, copies the job's output byte for byte in one pass, hands the lines to the sidecar
without ever blocking, reaps every child it adopts, and returns the job's exit code whatever
happens to the sidecar.
"""
from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import socket
import sys
import time
from types import FrameType
from typing import Callable

from stalldoc.errors import EXIT_STALL_KILLED, StalldocError, log_traceback
from stalldoc.relay.foreground import Foreground
from stalldoc.run.inject import agent_environment
from stalldoc.run.job import Ending, Job, become_subreaper, resolve_command
from stalldoc.relay.leftovers import describe, split_leftovers
from stalldoc.run.nodes import node_identity
from stalldoc.run.options import WatchOptions, make_node_run_dir
from stalldoc.run.rundir import earlier_attempts, next_attempt, requeued
from stalldoc.relay.plain import copy_until_exit, read_chunk
from stalldoc.relay.sidecar_link import SIDECAR_LOG, SidecarLink
from stalldoc.relay.streams import Stream, open_stream
from stalldoc.run.terminal import Terminal
from stalldoc.probes.exits import from_wait_status

LAUNCH_WAIT = 60.0     # seconds for the sidecar's launch checks; then the job starts anyway
DRAIN_WAIT = 2.0       # seconds for the job's output to close after it exited
FINISH_WAIT = 30.0     # seconds the sidecar gets to store the end of the run
SMALL_READ = 4096       # a read this small: the job writes line by line...
GATHER_SECONDS = 0.002  # ...so wait this long before the next (one wake-up per ~line batch)
FORWARDED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM, signal.SIGWINCH)
RELAY_ERRORS = "relay-errors.log"


class Relay:
    def __init__(self, options: WatchOptions) -> None:
        self.opts = options
        resolve_command(list(options.argv))  # a missing command fails before anything is created
        node = node_identity(options.argv, os.environ, socket.gethostname())
        again = requeued(os.environ)
        self.run_dir, shared = make_node_run_dir(options.run_dir, node, again)
        if node.multi:
            self.opts = dataclasses.replace(options, shared_dir=shared, node=node.name,
                                            node_index=node.index, nnodes=node.count)
        if again:
            self.opts = dataclasses.replace(
                self.opts, attempt=next_attempt(earlier_attempts(self.run_dir)))
        self.terminal = Terminal(sys.stderr)
        self.foreground = Foreground()
        self.job: Job | None = None
        self.code: int | None = None
        self.job_signal: int | None = None    # the signal the job died of
        self.exited_at = 0.0
        self.ended_by: str | None = None      # who ended the job on purpose: stalldoc / interrupt
        self.interrupted = False               # SIGINT reached us and went on to the job
        self.aborted: int | None = None       # a signal that came before the job started
        self.term_requested = False
        self.ending: Ending | None = None
        self.rank_sessions: set[int] = set()
        self.verdict: dict[str, object] | None = None
        self.streams: dict[int, Stream] = {}
        self.selector = selectors.DefaultSelector()

    # ----- life cycle -------------------------------------------------------------------------
    def run(self) -> int:
        become_subreaper()
        self._install_signals()
        self.out, self.err = open_stream("stdout", 1), open_stream("stderr", 2)
        self.link = SidecarLink(self.run_dir, _options_dict(self.opts, self.run_dir),
                                [(self.out.read_fd, 1), (self.err.read_fd, 2)])
        self.selector.register(self.link.inbox, selectors.EVENT_READ, "inbox")
        try:
            self._launch()
        except BaseException:
            self._stop_sidecar(FINISH_WAIT / 6)
            raise
        if self.aborted is not None:
            self._stop_sidecar(FINISH_WAIT / 6)
            return 128 + self.aborted
        try:
            self._relay_job()
        except Exception:  # noqa: BLE001 - a bug of ours must not cost the job its exit code
            self._internal_error()
            assert self.job is not None
            self.code = copy_until_exit({fd: st.target for fd, st in self.streams.items()},
                                        self.job.pid, self.code, self.exited_at, DRAIN_WAIT)
        ended = (f"job ended by stalldoc (--on-stall kill; the job's own exit status "
                 f"{self.code}, stalldoc exits {EXIT_STALL_KILLED})"
                 if self.ended_by == "stalldoc" else f"job exited {self.code}")
        self.say(f"{ended}; report: stalldoc report {self.run_dir}")
        return self._watch_code()

    def _watch_code(self) -> int:
        """What ``stalldoc watch`` exits with: the job's code, or 124 when --on-stall kill
        ended it."""
        return EXIT_STALL_KILLED if self.ended_by == "stalldoc" else int(self.code or 0)

    def _who_ended(self) -> str:
        """``stalldoc`` (--on-stall kill), ``interrupt`` (SIGTERM to us; SIGINT to us or, from
        the terminal, to the job, which it died of), else ``job``: it ended by itself."""
        if self.ended_by is not None:
            return self.ended_by
        by_sigint = self.job_signal == signal.SIGINT
        return "interrupt" if self.interrupted or by_sigint else "job"

    def _relay_job(self) -> None:
        self._serve(lambda: self.code is not None and (
            not self.streams or time.time() - self.exited_at > DRAIN_WAIT))
        assert self.code is not None
        self._finish_sidecar(self.code)
        self._end_leftovers()
        self.terminal.close()

    def _internal_error(self) -> None:
        self.say(f"internal error in the relay, only copying output now: "
                 f"{log_traceback(self.run_dir / RELAY_ERRORS)}")

    def _launch(self) -> None:
        deadline = time.time() + LAUNCH_WAIT
        self._serve(lambda: self.verdict is not None or not self.link.alive
                    or self.aborted is not None or time.time() > deadline)
        if self.aborted is not None:
            return
        if self.verdict is None:
            self.say("the launch checks gave no answer; starting the job without them")
        elif not self.verdict.get("launch"):
            raise StalldocError(str(self.verdict.get("why")))
        env = dict(os.environ)
        if self.opts.agent:
            env = agent_environment(self.run_dir, env, os.getpid(), self.opts.flight_recorder)
        out, err = self.out, self.err
        try:
            self.job = Job(list(self.opts.argv), env, out.job_fd, err.job_fd)
        finally:
            out.close_job_end()
            err.close_job_end()
        self.foreground.give(self.job.pid)
        for stream in (out, err):
            self.streams[stream.read_fd] = stream
            self.selector.register(stream.read_fd, selectors.EVENT_READ, "stream")
        self.link.outbox.control(f"J {self.job.pid} {self.job.started_at:.6f}")

    def _finish_sidecar(self, code: int) -> None:
        """The job ended: let the sidecar store the end (or stop waiting for it)."""
        self.link.outbox.control(f"E {code} {self.link.outbox.dropped} {self._watch_code()} "
                                 f"{self._who_ended()}")
        if self.link.outbox.dropped:
            self.say(f"{self.link.outbox.dropped} output line(s) were not analysed (the sidecar "
                     f"lagged); the job's output itself is complete")
        self._stop_sidecar(FINISH_WAIT)

    def _stop_sidecar(self, wait: float) -> None:
        """Close its pipe, give it ``wait`` seconds to store what it has, then SIGKILL it."""
        deadline = time.time() + wait
        outbox = self.link.outbox
        self._serve(lambda: not outbox.waiting or not self.link.alive or time.time() > deadline)
        self._unregister(outbox.fd)
        outbox.close()
        self._serve(lambda: not self.link.alive or time.time() > deadline)
        if self.link.alive:
            self.say(f"the sidecar did not finish in {wait:.0f} s; stopped it")
            _kill(self.link.pid)
            self._serve(lambda: not self.link.alive or time.time() > deadline + 5)
        self._unregister(self.link.inbox)
        self.link.close()

    def _end_leftovers(self) -> None:
        """What the job left behind: ended where still attached to it, else listed."""
        assert self.job is not None
        attached, detached = split_leftovers(self.job.descendants(), self.rank_sessions,
                                             self.opts.end_detached)
        if detached:
            self.say(f"left running, detached from the job (--end-detached ends them): "
                     f"{describe(detached)}")
        if attached:
            self.say(f"ending {len(attached)} process(es) the job left behind: "
                     f"{describe(attached)}")
            ending = Ending(attached, self.opts.kill_grace)
            self._serve(lambda: not ending.due(time.time()))

    # ----- the loop ---------------------------------------------------------------------------
    def _serve(self, done: Callable[[], bool]) -> None:
        """Relay output, messages and signals until ``done()``. Each turn costs little: a job
        printing line by line (PYTHONUNBUFFERED, a terminal) makes one turn per line."""
        reaped_at = 0.0
        while not done():
            outbox = self.link.outbox
            self._watch_outbox(outbox.waiting)
            due = outbox.due(time.time())
            child_ended = small = False
            for key, _ in self.selector.select(timeout=0.25 if due is None else due):
                if key.data == "stream":
                    small |= self._read_stream(key.fd) < SMALL_READ
                elif key.data == "inbox":
                    self._read_inbox()
                elif key.data == "outbox":
                    outbox.flush()
                else:
                    child_ended |= _woken_by(key.fd, signal.SIGCHLD)
            now = time.time()
            if outbox.due(now) == 0.0:
                outbox.pack()
            if child_ended or now - reaped_at > 1.0:   # SIGCHLD, or now and then to be sure
                self._reap()
                reaped_at = now
            self._handle_term()
            if self.ending is not None:
                self.ending.due(now)
            if small:
                time.sleep(GATHER_SECONDS)   # let a job writing line by line fill the pipe

    def _unregister(self, fd: int) -> None:
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def _watch_outbox(self, waiting: bool) -> None:
        if self.link.outbox.fd < 0:
            return
        registered = self.link.outbox.fd in self.selector.get_map()
        if waiting and not registered:
            self.selector.register(self.link.outbox.fd, selectors.EVENT_WRITE, "outbox")
        elif registered and not waiting:
            self.selector.unregister(self.link.outbox.fd)

    def _read_stream(self, fd: int) -> int:
        """Copy what the job wrote on; how many bytes it was."""
        stream = self.streams[fd]
        data = read_chunk(fd)
        if not data:
            self.link.outbox.control(f"Z{stream.name[3]}")
            self.selector.unregister(fd)
            os.close(fd)
            del self.streams[fd]
            return SMALL_READ
        self.terminal.job_output(stream.target, data)
        self.link.outbox.chunk(stream.name, time.time(), data)
        return len(data)

    def _read_inbox(self) -> None:
        for message in self.link.messages():
            if "say" in message:
                self.say(str(message["say"]))
            elif "status" in message:
                self.terminal.status(str(message["status"]))
            elif "launch" in message:
                self.verdict = message
            elif "rank_pid" in message:
                self._rank_started(int(str(message["rank_pid"])))
            elif message.get("end_job") == "stall":
                self._end_job("stalldoc")
        if not self.link.inbox_open:
            self._unregister(self.link.inbox)

    def _rank_started(self, pid: int) -> None:
        try:
            self.rank_sessions.add(os.getsid(pid))
        except OSError:
            pass

    def _reap(self) -> None:
        """Collect every child that ended: the job, the sidecar, and adopted orphans."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if os.WIFSTOPPED(status):
                if self.job is not None and pid == self.job.pid and self.foreground.tty is not None:
                    self.foreground.stop_with_job()
                continue
            if pid == self.link.pid:
                self._sidecar_ended(status)
                continue
            self.link.outbox.control(f"X {pid} {status}")
            if self.job is not None and pid == self.job.pid:
                self.code, self.job_signal = from_wait_status(status)
                self.exited_at = time.time()

    def _sidecar_ended(self, status: int) -> None:
        self.link.exit_status = status
        refused = self.verdict is not None and not self.verdict.get("launch")
        if self.code is not None or (self.job is None and refused):
            return   # the job ended first, or the sidecar refused the launch: its line follows
        how = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
               if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
        self.terminal.close()
        self.say(f"the sidecar stopped ({how}; see {self.run_dir / SIDECAR_LOG}); the job "
                 + ("runs on, unwatched" if self.job is not None else "starts unwatched"))

    # ----- signals ----------------------------------------------------------------------------
    def _install_signals(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.selector.register(wake_r, selectors.EVENT_READ, "wakeup")
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGTSTP, self._forward)
        signal.signal(signal.SIGCONT, self._on_cont)
        signal.signal(signal.SIGCHLD, _ignore)

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        if self.job is None:
            if signum in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
                self.aborted = signum
            return
        if signum == signal.SIGINT and self.code is None:
            self.interrupted = True
            self.link.outbox.control("I")   # the user's interrupt: what ends now is theirs
        if signum == signal.SIGWINCH:
            for stream in self.streams.values():
                stream.sync_size()
        self.job.signal_group(signum)

    def _on_cont(self, signum: int, _frame: FrameType | None) -> None:
        self.foreground.resumed()
        if self.job is not None:
            self.job.signal_group(signum)

    def _on_term(self, signum: int, _frame: FrameType | None) -> None:
        """Only a flag: the loop ends the job (a handler may interrupt the terminal's lock)."""
        if self.job is None:
            self.aborted = signum
        else:
            self.term_requested = True

    def _handle_term(self) -> None:
        if self.term_requested and self.ending is None:
            self.say("SIGTERM: ending the job")
            self._end_job("interrupt")

    def _end_job(self, by: str) -> None:
        """End the whole job tree (SIGTERM, then SIGKILL after --kill-grace); ``by``: who asked.
        The first to ask while the job runs is who ended it (its code is then settled: the
        sidecar is told it with the job's)."""
        if self.job is None or self.ending is not None:
            return
        if self.code is None:
            self.ended_by = by
        self.link.outbox.control("T")
        self.ending = Ending(self.job.descendants(exclude=self.link.pid), self.opts.kill_grace)

    def say(self, message: str) -> None:
        self.terminal.message(message)


def _options_dict(options: WatchOptions, run_dir: object) -> dict[str, object]:
    data = dataclasses.asdict(options)
    data["run_dir"] = str(run_dir)
    data["shared_dir"] = str(options.shared_dir) if options.shared_dir else None
    data["argv"] = list(options.argv)
    return data


def _woken_by(fd: int, signum: int) -> bool:
    """Empty the signal wakeup pipe; whether ``signum`` was among the signals in it."""
    seen = b""
    try:
        while chunk := os.read(fd, 4096):
            seen += chunk
    except OSError:
        pass
    return bytes([signum]) in seen


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """SIGCHLD: only wakes the loop (through the wakeup fd), which reaps."""
