"""The sidecar's watcher: sample every rank of the job each tick, detect stalls, diagnose them.

It runs in the sidecar process (``sidecar/process.py``); the relay (``relay/relay.py``) owns the job, its
output and its exit code. Whatever goes wrong in here is written to the run directory and the
watcher steps aside; the job never notices.

The watcher is the loop that calls its parts, each a module of its own: who is who in the job
(``roster.py``: ranks, engines, a Ray job's driver and actors, attempts), exits
(``exit_judge.py``), stalls and their diagnosis (``diagnosis.py``), publishing (``publishing.py``:
metrics, the other nodes, the status line); what they share is in ``context.py``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

from stalldoc.check.preflight import failed, launch_checks, launch_document
from stalldoc.detect.vllm_sleep import SleepLog
from stalldoc.errors import StalldocError, log_traceback
from stalldoc.launch.config import parse_command
from stalldoc.model.findings import Finding
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import RankStacks
from stalldoc.probes.flight_dumps import FlightDumps
from stalldoc.probes.process_tree import task_executor
from stalldoc.probes.pyspy import BackgroundStacks, StackProbe
from stalldoc.probes.versions import RunVersions
from stalldoc.report.text import render_findings
from stalldoc.rules import STICKY, run_rules
from stalldoc.run.inject import flight_settings
from stalldoc.run.job import JobTree
from stalldoc.run.options import WatchOptions
from stalldoc.run.rundir import earlier_attempts
from stalldoc.sidecar.agentless import AgentlessRanks
from stalldoc.sidecar.cluster import NodeCluster
from stalldoc.sidecar.context import Context, Sources, say_on
from stalldoc.sidecar.diagnosis import Diagnosis
from stalldoc.sidecar.engine_progress import EngineProgress
from stalldoc.sidecar.exit_judge import ExitJudge
from stalldoc.sidecar.history import Histories, gpu_util_by_rank
from stalldoc.sidecar.link import RelayLink
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.sidecar.preemptions import PreemptionWatch
from stalldoc.sidecar.publishing import Publisher
from stalldoc.sidecar.ray_job import RayJob
from stalldoc.sidecar.roster import Roster
from stalldoc.sidecar.run_facts import RunFacts
from stalldoc.sidecar.sampling import Sampler, Tick
from stalldoc.sidecar.served import ServedRanks
from stalldoc.sidecar.windows import Windows

INTERNAL_ERRORS = "stalldoc-errors.log"
LAUNCH_CHECK_SECONDS = 10.0   # the job launches after this even if a check has not finished
MAX_ERROR_KINDS = 20   # distinct tick errors written out in full; later ones are only counted
DRAIN_SHARE = 0.25     # of the interval: the most a tick spends reading the job's output
DRAIN_MIN_S = 0.05


class Watcher:
    """The watch's loop: it builds the parts, ticks them in turn, and ends the run."""

    def __init__(self, options: WatchOptions, link: RelayLink) -> None:
        self.link = link
        self.ctx = ctx = Context(options, link)
        self.run_dir, self.store, self.agent_dir = ctx.run_dir, ctx.store, ctx.agent_dir
        self.tracker, self.ledger, self.exits = ctx.tracker, ctx.ledger, ctx.exits
        self.sampler = Sampler(self.agent_dir, options.gpus)
        self.agents_probe = self.sampler.agents
        self.stack_probe = StackProbe(self.agent_dir)
        self.background = BackgroundStacks(self.stack_probe)
        self.ray_job = RayJob(self.agent_dir, self.stack_probe, options.stall_timeout)
        self.logs = LogFeed()
        link.on_line = self.logs.put
        self.sources = Sources(
            self.sampler, self.stack_probe, Histories(), self.logs, SleepLog(),
            ServedRanks(self.agent_dir), PreemptionWatch(self.agent_dir),
            AgentlessRanks(str(self.run_dir / "bootstrap")),
            NodeCluster(options, self.run_dir, socket.gethostname(), time.time()), self.ray_job)
        self.history = self.sources.history
        self.engine_progress = EngineProgress()   # the vLLM engines' forward passes, by tick
        self.roster = Roster(ctx, self.sources)
        self.windows = Windows(ctx, self.sources, self.roster)
        self.exit_judge = ExitJudge(ctx, self.sources, self.roster, self.windows)
        self.publisher = Publisher(ctx, self.roster, self.sources.cluster, self.logs)
        self.diagnosis = Diagnosis(ctx, self.sources, self.roster, self.windows, self.publisher)
        self.launch_plan: dict | None = None   # the launch checks' plan, resources and skips
        self.versions = RunVersions(self.agent_dir, self.sampler.nvml.driver_version())
        self.run_facts = RunFacts(ctx, self.agents_probe, self.versions)
        self.job = JobTree(0, os.getppid())
        self.started_at = time.time()
        self.tick_errors = 0
        self.store_trouble_said = False
        self.tick_error_kinds: set[str] = set()

    # ----- what attach reads and sets -----------------------------------------------------------
    @property
    def opts(self) -> WatchOptions:
        return self.ctx.opts

    @opts.setter
    def opts(self, options: WatchOptions) -> None:
        self.ctx.opts = options

    @property
    def flight(self) -> FlightDumps | None:
        return self.diagnosis.flight

    @flight.setter
    def flight(self, flight: FlightDumps | None) -> None:
        self.diagnosis.flight = flight

    @property
    def ranks(self) -> dict[int, RankProcess]:
        return self.roster.ranks

    @property
    def stall_stacks(self) -> dict[int, RankStacks]:
        return self.diagnosis.stall_stacks

    # ----- life cycle -------------------------------------------------------------------------
    def run(self) -> int:
        """Launch checks, then watch the job the relay started until it says the job ended."""
        launch_findings = self._before_launch()
        if launch_findings is None:
            return 0
        self.link.job_started.wait()
        if not self.link.job_pid:
            self.store.close()
            return 0
        self.job = JobTree(self.link.job_pid, os.getppid())
        self.started_at = self.link.job_started_at
        self.store.start_run(self.run_dir.name, list(self.opts.argv), socket.gethostname(),
                             self.started_at, self.opts.stall_timeout, self.opts.agent)
        self.store.set_meta("on_stall", self.opts.on_stall)
        self.store.set_meta("flight_recorder", json.dumps(flight_settings(
            self.run_dir, dict(os.environ), self.flight is not None)))
        if self.launch_plan is not None:
            self.store.set_meta("launch_plan", json.dumps(self.launch_plan))
        self.store.set_meta("versions", json.dumps(self.versions.initial()))
        self.say(f"watching pid {self.link.job_pid}; run directory {self.run_dir}")
        self._begin_requeued()
        self.publisher.say_cluster()
        if self.store.journal.reason:
            self.say(self.store.journal.reason)
        for probe, why in self.sampler.unavailable.items():
            self.store.probe_unavailable(probe, why)
            self.say(f"{probe} probe off: {why}")
        self.ctx.save(self.ledger.launch(self.started_at, launch_findings))
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - never harm the job
            self._internal_error()
        self._finish(self.link.job_code)
        return 0

    def _before_launch(self) -> list[Finding] | None:
        """The launch checks and the metrics server; tell the relay whether to start the job
        (None: it must not)."""
        self.ctx.config = parse_command(self.opts.argv, dict(os.environ))
        if self.ctx.config.error:
            self.say(f"launch checks: {self.ctx.config.error}")
        findings = self._launch_rules()
        try:
            if self.opts.strict and failed(findings, strict=True):
                raise StalldocError("launch checks found problems and --strict is set; job not "
                                    "launched")
            self.publisher.open_exporter()
        except StalldocError as error:
            self.store.close()
            self.link.send(launch=False, why=error.message)
            return None
        if self.publisher.exporter is not None:
            self.say(f"metrics on http://{self.opts.metrics_addr}:{self.publisher.exporter.port}"
                     "/metrics")
        self.link.send(launch=True)
        return findings

    def _loop(self) -> None:
        """A tick every ``interval`` until the job ends; its end cuts the wait short (the run
        ends as soon as the job does, not up to an interval later)."""
        while self.link.job_code is None and not self._job_gone():
            self._safe_tick(time.time())
            self.link.job_ended.wait(self.opts.interval)

    def _safe_tick(self, now: float) -> None:
        """One tick; whatever it raises is written down, said once per kind, and the next tick
        runs: one bad value never stops the watching."""
        try:
            self.tick(now)
        except Exception as exc:  # noqa: BLE001 - never harm the job, never stop watching
            self.tick_errors += 1
            kind = f"{type(exc).__name__}: {str(exc)[:160]}"
            if kind not in self.tick_error_kinds and len(self.tick_error_kinds) < MAX_ERROR_KINDS:
                self.tick_error_kinds.add(kind)
                self._internal_error("tick skipped, watching goes on")
        if self.store.write_errors and not self.store_trouble_said:
            self.store_trouble_said = True
            self.say(f"the run store cannot be written ({self.store.first_error}); watching and "
                     f"diagnosis go on here, without the run directory")

    def _job_gone(self) -> bool:
        """Without the relay (it was killed) nobody tells us the job ended: its tree is gone."""
        return self.link.relay_gone and not self.job.descendants(exclude=os.getpid())

    def _finish(self, code: int | None) -> None:
        """After the job's own process ended: last samples and exits, the end of the run."""
        try:
            time.sleep(0.3)  # let the death watch see the last ranks go
            self._drain_logs(final=True)
            self._tick_rules(time.time(), {}, final=True)
            if code == 0:
                self.exit_judge.resolve_shutdown_lines(time.time())
            self.exit_judge.collect(time.time(), final=True, job_code=code)
            self.exit_judge.resolve_moved_on(time.time())
            dropped = self.link.dropped + self.logs.dropped
            if dropped:
                self.store.set_meta("dropped_log_lines", str(dropped))
            if self.tick_errors:
                self.store.set_meta("tick_errors", str(self.tick_errors))
            self.run_facts.store_startup_costs(self.ranks.values())
            self.run_facts.store_versions(self.ranks.values(), final=True)
            self.run_facts.store_exit_codes()
            self.publisher.publish_node(time.time(), {}, self.stall_stacks, ended=True)
            self.publisher.publish_card(time.time(), ended=True, code=code)
            self.store.end_run(time.time(), code)
            self.store.close()
        except Exception:  # noqa: BLE001
            self._internal_error()
        for part in (self.exits, self.sampler, self.background, self.ray_job, self.publisher):
            part.close()

    def _begin_requeued(self) -> None:
        """A requeue of the run in this directory: its findings say its attempt, the store and
        the terminal where the earlier runs are (set aside by the relay)."""
        if self.opts.attempt == 1:
            return
        earlier = earlier_attempts(self.run_dir)
        self.ledger.begin_attempt(self.opts.attempt, 0.0)
        self.store.set_meta("attempt", json.dumps({"attempt": self.opts.attempt,
                                                   "earlier": earlier}))
        self.say(f"attempt {self.opts.attempt}: Slurm runs the job again; the run before is in "
                 f"{self.run_dir / earlier[-1]}")

    def _internal_error(self, what: str = "watching stopped (job runs on)") -> None:
        self.say(f"internal error, {what}: {log_traceback(self.run_dir / INTERNAL_ERRORS)}")

    # ----- one tick: each step a call into a part ---------------------------------------------
    def tick(self, now: float) -> None:
        self._discover(now)                          # roster: which processes are the ranks
        self.run_facts.sweep(now, self.ranks.values())   # state files of processes gone
        sample = self._sample(now)                   # probes: host, GPUs, agents; histories
        self._take_background_stacks()               # probes: stacks taken off the tick
        self._drain_logs()                           # the job's output: progress, vLLM sleep
        self._observe(now, sample)                   # detect: each rank's work; other nodes
        self._request_stacks(now)                    # probes: the stacks the detector wants
        self.exit_judge.collect(now, final=False)    # exits: ranks that ended
        self.diagnosis.check_stall(now, sample.agents)   # detect -> diagnosis: a stall
        self._tick_rules(now, sample.agents)         # rules that watch over time
        self.diagnosis.forget_ended_stall()
        self.publisher.publish(now, sample, self.history.step_shares())   # metrics
        self.publisher.publish_node(now, sample.agents, self.stall_stacks)   # other nodes
        self.publisher.publish_card(now)             # the watches beside this one
        self.publisher.status(now, self.started_at)  # the terminal's live line
        self._record(now, sample)                    # store

    def _discover(self, now: float) -> None:
        """The roster's discovery, said and told to the relay; then the exits its new
        processes recovered from, and the Ray part's news."""
        found = self.roster.discover(now, self.job)
        for pid in found.launched:   # a launched rank: the relay ends what is left in its session
            self.link.send(rank_pid=pid)
        for line in found.lines:
            self.say(line)
        self.exit_judge.recover_restarts(now)
        for line in self.roster.refresh_outside(now):
            self.say(line)

    def _sample(self, now: float) -> Tick:
        live = self.roster.live()
        found = self.roster.found
        engines = found.engines if found is not None else ()
        self.ctx.engine_tick = self.engine_progress.tick(
            engines, self.agents_probe.markers(e.pid for e in engines if e.role == "worker"),
            self.agents_probe.of_pids(e.pid for e in engines if e.role == "engine core"), now)
        sample = self.sampler.sample(now, live, list(self.ranks.values()), self.roster.parents,
                                     found, self.ctx.engine_tick.serving)
        self.history.add(sample)
        return sample

    def _take_background_stacks(self) -> None:
        for stacks in self.background.done():   # taken off the tick since the last one
            rank = self.ranks.get(stacks.rank)
            if rank is not None and rank.pid == stacks.pid:   # not a process since replaced
                self.tracker.stack_seen(stacks.rank, stacks, stacks.t)

    def _observe(self, now: float, sample: Tick) -> None:
        engine_tick, cluster = self.ctx.engine_tick, self.sources.cluster
        host = self.sources.served.without_traffic(sample.host, engine_tick.ran)
        self.tracker.observe(now, sample.agents, host, gpu_util_by_rank(sample),
                             self.roster.ending(), engine_tick.progressed)
        live = self.tracker.live()
        self.ray_job.observe(now, bool(live) and set(live) <= self.tracker.between_tasks(now),
                             bool(self.tracker.in_task(now)))
        episode = self.tracker.episode
        if episode is not None and episode.outside and self.ray_job.moved_at > episode.detected_at:
            self.tracker.job_progressed(now)   # the driver or an actor works again
        cluster.refresh(now, self.tracker.quiet_for(now), self.tracker.threshold(),
                        self.tracker.episode is not None)

    def _request_stacks(self, now: float) -> None:
        executors = {r.rank for r in self.ranks.values() if task_executor(r.cmdline)}
        for rank in self.tracker.stacks_due(now, executors):
            if rank in self.ranks:
                self.background.request(self.ranks[rank])

    def _record(self, now: float, sample: Tick) -> None:
        self.store.add_tick(sample)
        self.store.compact(now, self.tracker.threshold() + self.store.policy.around_before)

    def _drain_logs(self, final: bool = False) -> None:
        """The job's output since the last tick; a tick reads it for at most a share of its
        interval (a flood waits, then its oldest lines go), the last drain reads it all."""
        drained = self.logs.drain(None if final else max(DRAIN_MIN_S,
                                                         DRAIN_SHARE * self.opts.interval))
        self.sources.sleep_log.feed(drained.lines)
        if drained.unplaceable_at is not None:
            self.ray_job.said_unplaceable(drained.unplaceable_at)
        if drained.progress_at is not None:
            self.tracker.job_progressed(drained.progress_at)
        elif drained.counted_at is not None and len(self.ranks) == 1:
            self.tracker.job_progressed(drained.counted_at)   # a one-process job's step line
        self.store.add_logs(drained.lines)

    # ----- rules ------------------------------------------------------------------------------
    def _launch_rules(self) -> list[Finding]:
        """What the command line says before anything runs; printed, never blocking."""
        try:
            gpus = self.sampler.nvml.sample(time.time()) if self.sampler.gpus_on else []
            checks = launch_checks(self.ctx.config, gpus, LAUNCH_CHECK_SECONDS,
                                   command=tuple(self.opts.argv))
        except Exception:  # noqa: BLE001 - a rule's failure must not stop the launch
            self._internal_error("launch checks skipped")
            return []
        self.launch_plan = launch_document(checks)
        for skipped in checks.skipped:
            self.say(f"launch check skipped: {skipped}")
        findings = list(checks.findings)
        if findings:
            self.say("before launch:\n" + render_findings(findings))
        return findings

    def _tick_rules(self, now: float, agents: dict, final: bool = False) -> None:
        """The cheap rules, every tick: open, update and resolve their findings. ``final``: the
        last look once the job ended, for the lines it printed last (events only: the state
        rules' findings stay as the last tick left them)."""
        window = dataclasses.replace(
            self.windows.window(now, agents, self.tracker.episode, self.stall_stacks),
            flight=self.diagnosis.stall_flight,
            spinning=self.ray_job.spinning(now, self.opts.busy_timeout))
        self.logs.take_unread()
        if self.ctx.ending:
            return   # the ranks are being ended: their last moments (the lines they print
            # as they die, read by the last look too) are no new findings
        findings = run_rules(window, "tick")
        if final:
            findings = [f for f in findings if f.code in STICKY]
        changes = self.ctx.save(self.ledger.tick(now, findings, resolve=not final))
        if changes.opened:
            self.say("finding:\n" + render_findings(e.finding for e in changes.opened))
        self.ctx.say_resolved(changes)

    def say(self, message: str) -> None:
        """A message for stalldoc's stderr (and sidecar.log once the relay is gone), redacted:
        some quote the job (findings, an unreadable config file, an internal error)."""
        say_on(self.link, message)
