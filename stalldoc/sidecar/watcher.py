"""The sidecar's watcher: sample every rank of the job each tick, detect stalls, diagnose them.

It runs in the sidecar process (``sidecar/process.py``); the relay (``relay/relay.py``) owns the job, its
output and its exit code. Whatever goes wrong in here is written to the run directory and the
watcher steps aside; the job never notices.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from typing import Iterable, Mapping

from stalldoc.agent.statefile import STATUS_EXCEPTION
from stalldoc.analysis.stacks import server_wait, waits_on_build_lock, waits_on_http
from stalldoc.check.preflight import failed, launch_checks, launch_document
from stalldoc.cluster.publish import LocalView
from stalldoc.detect.progress import ProgressTracker, latest_progress
from stalldoc.detect.vllm_sleep import SleepLog
from stalldoc.errors import StalldocError, log_traceback
from stalldoc.findings.ledger import Changes, Ledger, in_attempt
from stalldoc.launch.config import LaunchConfig, parse_command
from stalldoc.model.collectives import FlightDump
from stalldoc.model.findings import Finding
from stalldoc.model.ranks import (EngineProcess, EngineState, RankExit, RankProcess,
                                  claim_strength)
from stalldoc.model.stacks import BuildLock, RankStacks
from stalldoc.model.window import Window
from stalldoc.model.work import RankWork, StallEpisode, describe_together
from stalldoc.probes.agent_state import StartupCosts
from stalldoc.probes.build_locks import build_locks
from stalldoc.probes.connections import external_peers
from stalldoc.probes.engine_settings import read_engine_settings
from stalldoc.probes.exits import from_wait_status
from stalldoc.probes.flight_dumps import FlightDumps
from stalldoc.probes.process_tree import task_executor
from stalldoc.probes.pyspy import BackgroundStacks, StackProbe
from stalldoc.probes.versions import RunVersions
from stalldoc.redact import redact_text
from stalldoc.report.text import render_findings
from stalldoc.rules import ENDS_WITH_PROGRESS, STICKY, run_rules
from stalldoc.rules.base import join_ranks
from stalldoc.run.inject import FLIGHT_DIR, flight_settings
from stalldoc.run.job import JobTree
from stalldoc.run.options import WatchOptions
from stalldoc.run.rundir import earlier_attempts
from stalldoc.run.terminal import RankLine, format_status
from stalldoc.sidecar.agentless import AgentlessRanks
from stalldoc.sidecar.attempts import Attempts
from stalldoc.sidecar.children import child_stacks
from stalldoc.sidecar.engine_progress import EngineProgress, EngineTick
from stalldoc.sidecar.preemptions import PreemptionWatch
from stalldoc.sidecar.ray_job import RayJob
from stalldoc.sidecar.served import ServedRanks, peer_servers
from stalldoc.sidecar.cluster import NodeCluster
from stalldoc.sidecar.exits import ExitBook, of_present
from stalldoc.sidecar.history import Histories, gpu_util_by_rank
from stalldoc.sidecar.link import RelayLink
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.sidecar.metrics import Exporter, MetricsState, job_name
from stalldoc.sidecar.sampling import Discovery, Sampler, Tick
from stalldoc.store.db import RunStore

INTERNAL_ERRORS = "stalldoc-errors.log"
SWEEP_SECONDS = 5.0
LAUNCH_CHECK_SECONDS = 10.0   # the job launches after this even if a check has not finished
MAX_ERROR_KINDS = 20   # distinct tick errors written out in full; later ones are only counted
SHUTDOWN_SECONDS = 60.0   # an event only libraries' shutdown also prints, this close to a clean exit


class Watcher:
    def __init__(self, options: WatchOptions, link: RelayLink) -> None:
        self.opts = options
        self.link = link
        assert options.run_dir is not None   # the relay made it
        self.run_dir = options.run_dir
        self.store = RunStore(self.run_dir)
        self.agent_dir = str(self.run_dir / "agents") if options.agent else None
        self.sampler = Sampler(self.agent_dir, options.gpus)
        self.agents_probe = self.sampler.agents
        self.stack_probe = StackProbe(self.agent_dir)
        self.background = BackgroundStacks(self.stack_probe)
        self.ray_job = RayJob(self.agent_dir, self.stack_probe, options.stall_timeout)
        self.tracker = ProgressTracker(options.stall_timeout)
        self.ranks: dict[int, RankProcess] = {}
        self.exits = ExitBook(self.store)   # ranks that ended; its death watch
        self.attempts = Attempts()          # which attempt: the launcher may restart the ranks
        self.logs = LogFeed()
        self.sleep_log = SleepLog()   # vLLM engines' sleep state from their log lines
        link.on_line = self.logs.put
        self.history = Histories()
        self.ledger = Ledger(STICKY)   # every finding of the run
        self.killed_for_stall = False
        self.explained: set[str] = set()
        self.parents: dict[int, int] = {}
        self.engines: dict[int, EngineProcess] = {}   # vLLM engine processes, as last said
        self.engine_progress = EngineProgress()   # their forward passes, tick by tick
        self.engine_tick = EngineTick()
        self.served = ServedRanks(self.agent_dir)   # ranks that serve HTTP, their vLLM metrics
        self.preemptions = PreemptionWatch(self.agent_dir)   # their engines' full KV caches
        self.agentless = AgentlessRanks(str(self.run_dir / "bootstrap"))   # ranks without one
        self.found: Discovery | None = None   # this tick's processes, from one table scan
        self.config: LaunchConfig | None = None
        self.launch_plan: dict | None = None   # the launch checks' plan, resources and skips
        self.versions = RunVersions(self.agent_dir, self.sampler.nvml.driver_version())
        self.stall_stacks: dict[int, RankStacks] = {}   # taken at its diagnosis, for tick rules
        self.stall_flight: dict[int, FlightDump] = {}   # the Flight Recorder dumps, likewise
        self.stall_over = False   # the stall ended this tick: its stacks go after the tick rules
        self.gpu_peaks: dict[int, int] = {}
        self.exporter: Exporter | None = None
        self.job = JobTree(0, os.getppid())
        self.started_at = time.time()
        self.startup_costs = StartupCosts()
        self.swept_at = 0.0
        self.tick_errors = 0
        self.store_trouble_said = False
        self.tick_error_kinds: set[str] = set()
        self.cluster = NodeCluster(options, self.run_dir, socket.gethostname(), time.time())
        self.flight = FlightDumps(self.run_dir / "agents", self.run_dir / FLIGHT_DIR) \
            if options.agent and options.flight_recorder else None

    @property
    def ending(self) -> bool:
        """The job is being ended on purpose: its ranks' deaths are ours, not findings."""
        return self.link.ending or self.killed_for_stall

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
        self._say_cluster()
        if self.store.journal.reason:
            self.say(self.store.journal.reason)
        for probe, why in self.sampler.unavailable.items():
            self.store.probe_unavailable(probe, why)
            self.say(f"{probe} probe off: {why}")
        self._save(self.ledger.launch(self.started_at, launch_findings))
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - never harm the job
            self._internal_error()
        self._finish(self.link.job_code)
        return 0

    def _before_launch(self) -> list[Finding] | None:
        """The launch checks and the metrics server; tell the relay whether to start the job
        (None: it must not)."""
        self.config = parse_command(self.opts.argv, dict(os.environ))
        if self.config.error:
            self.say(f"launch checks: {self.config.error}")
        findings = self._launch_rules()
        try:
            if self.opts.strict and failed(findings, strict=True):
                raise StalldocError("launch checks found problems and --strict is set; job not "
                                    "launched")
            if self.opts.metrics_port is not None:
                self.exporter = Exporter(self.opts.metrics_port, self.opts.metrics_addr,
                                         MetricsState(self._run_id(), socket.gethostname(),
                                                      job_name(self.config),
                                                      node_name=self._node_name()))
        except StalldocError as error:
            self.store.close()
            self.link.send(launch=False, why=error.message)
            return None
        if self.exporter is not None:
            self.say(f"metrics on http://{self.opts.metrics_addr}:{self.exporter.port}/metrics")
        self.link.send(launch=True)
        return findings

    def _loop(self) -> None:
        while self.link.job_code is None and not self._job_gone():
            self._safe_tick(time.time())
            time.sleep(self.opts.interval)

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
            self._drain_logs()
            self._tick_rules(time.time(), {}, final=True)
            if code == 0:
                self._resolve_shutdown_lines(time.time())
            self._collect_exits(time.time(), final=True, job_code=code)
            self._resolve_moved_on(time.time())
            dropped = self.link.dropped + self.logs.dropped
            if dropped:
                self.store.set_meta("dropped_log_lines", str(dropped))
            if self.tick_errors:
                self.store.set_meta("tick_errors", str(self.tick_errors))
            self._store_startup_costs()
            self._store_versions(final=True)
            self._store_exit_codes()
            self._publish_node(time.time(), {}, ended=True)
            self.store.end_run(time.time(), code)
            self.store.close()
        except Exception:  # noqa: BLE001
            self._internal_error()
        for part in (self.exits, self.sampler, self.background, self.ray_job, self.exporter):
            if part is not None:
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

    def _store_exit_codes(self) -> None:
        """watch's own exit code and who ended the job, as the relay told (unknown, and not
        stored, when the relay was killed: then no code reached the shell from it)."""
        if self.link.watch_code is not None:
            self.store.set_meta("watch_exit_code", str(self.link.watch_code))
            self.store.set_meta("ended_by", self.link.ended_by)

    def _store_startup_costs(self) -> None:
        """The agent's start-up cost per Python process of the job (ranks and the rest)."""
        self.agents_probe.sweep({r.pid for r in self.ranks.values()}, self.startup_costs)
        for snapshot in self.agents_probe.sample(list(self.ranks.values())).values():
            if snapshot.identity is not None:
                self.startup_costs.add(snapshot.identity.startup_seconds)
        summary = self.startup_costs.summary()
        if summary is not None:
            self.store.set_meta("agent_startup", json.dumps(summary))

    def _sweep(self, now: float) -> None:
        """Every few seconds: forget the state files of ended processes that were not ranks."""
        if now - self.swept_at >= SWEEP_SECONDS:
            self.swept_at = now
            self.agents_probe.sweep({r.pid for r in self.ranks.values()}, self.startup_costs)
            self._store_versions()

    def _store_versions(self, final: bool = False) -> None:
        """The versions a rank published, once it has (``probes/versions.py``)."""
        found = self.versions.update(self.ranks.values(), final)
        if found is not None:
            self.store.set_meta("versions", json.dumps(found))

    def _internal_error(self, what: str = "watching stopped (job runs on)") -> None:
        self.say(f"internal error, {what}: {log_traceback(self.run_dir / INTERNAL_ERRORS)}")

    # ----- one tick: each step a call into a stage ----------------------------------------------
    def tick(self, now: float) -> None:
        self._discover(now)                      # probes: which processes are the ranks
        self._sweep(now)                         # probes: state files of processes gone
        sample = self._sample(now)               # probes: host, GPUs, agents; the histories
        self._take_background_stacks()           # probes: stacks taken off the tick
        self._drain_logs()                       # the job's output: progress, vLLM sleep
        self._observe(now, sample)               # detect: each rank's work; the other nodes
        self._request_stacks(now)                # probes: the stacks the detector wants next
        self._collect_exits(now, final=False)    # rules: ranks that ended
        self._check_stall(now, sample.agents)    # detect -> analysis -> rules: a stall
        self._tick_rules(now, sample.agents)     # rules that watch over time
        self._forget_ended_stall()
        self._publish(now, sample)               # metrics
        self._publish_node(now, sample.agents)   # cluster: our summary for the other nodes
        self._status(now)                        # the terminal's live line
        self._record(now, sample)                # store

    def _live(self) -> list[RankProcess]:
        """The ranks whose present process has not ended."""
        return [r for r in self.ranks.values() if not self.exits.ended(r)]

    def _sample(self, now: float) -> Tick:
        live = self._live()
        engines = self.found.engines if self.found is not None else ()
        self.engine_tick = self.engine_progress.tick(
            engines, self.agents_probe.markers(e.pid for e in engines if e.role == "worker"),
            self.agents_probe.of_pids(e.pid for e in engines if e.role == "engine core"), now)
        sample = self.sampler.sample(now, live, list(self.ranks.values()), self.parents,
                                     self.found, self.engine_tick.serving)
        self.history.add(sample)
        return sample

    def _take_background_stacks(self) -> None:
        for stacks in self.background.done():   # taken off the tick since the last one
            rank = self.ranks.get(stacks.rank)
            if rank is not None and rank.pid == stacks.pid:   # not a process since replaced
                self.tracker.stack_seen(stacks.rank, stacks, stacks.t)

    def _observe(self, now: float, sample: Tick) -> None:
        host = self.served.without_traffic(sample.host, self.engine_tick.ran)
        self.tracker.observe(now, sample.agents, host, gpu_util_by_rank(sample),
                             self._ending(), self.engine_tick.progressed)
        live = self.tracker.live()
        self.ray_job.observe(now, bool(live) and set(live) <= self.tracker.between_tasks(now))
        episode = self.tracker.episode
        if episode is not None and episode.outside and self.ray_job.moved_at > episode.detected_at:
            self.tracker.job_progressed(now)   # the driver or an actor works again
        self.cluster.refresh(now, self.tracker.quiet_for(now), self.tracker.threshold(),
                             self.tracker.episode is not None)

    def _ending(self) -> set[int]:
        """Ranks whose process is ending (a zombie, or gone from this tick's process table)
        while the death watch has not seen its last thread go."""
        table = self.found.table if self.found is not None else None
        if table is None:
            return set()
        return {r.rank for r in self._live() if r.pid not in table or table.procs[r.pid].dead}

    def _request_stacks(self, now: float) -> None:
        executors = {r.rank for r in self.ranks.values() if task_executor(r.cmdline)}
        for rank in self.tracker.stacks_due(now, executors):
            if rank in self.ranks:
                self.background.request(self.ranks[rank])

    def _forget_ended_stall(self) -> None:
        """A stall that ended this tick: its stacks and dumps served this tick's rules (a
        watchdog line printed as the ranks died names the frames seen in the stall); now they
        go."""
        if self.stall_over:
            self.stall_stacks, self.stall_flight, self.stall_over = {}, {}, False

    def _record(self, now: float, sample: Tick) -> None:
        self.store.add_tick(sample)
        self.store.compact(now, self.tracker.threshold() + self.store.policy.around_before)

    def _discover(self, now: float) -> None:
        # once ranks with RANK were seen, the job is distributed: no single-process fallback
        distributed = any(r.from_env for r in self.ranks.values())
        self.found = self.sampler.discover(self.job, os.getpid(), not distributed)
        self.parents = self.found.parents
        self._drop_guesses(self.found.ranks)
        self._name_engines(self.found.engines)
        for rank, url in self.served.refresh(self.found.ranks, self.parents):
            self.say(f"rank {rank} serves {url}: requests are its work, and while its engine "
                     "waits for them it is not stalled")
        for rank in self.found.ranks:
            known = self.ranks.get(rank.rank)
            if known is not None and known.pid == rank.pid:
                if known != rank and not _weaker(rank, known):   # it said which rank it is since
                    self.ranks[rank.rank] = rank
                    self.store.update_rank(rank)
                    if rank.from_env > known.from_env or (rank.world_rank is not None
                                                          and known.world_rank is None):
                        self.say(f"rank {rank.rank}: pid {rank.pid}{_known_as(rank)}")
                continue
            self._begin_attempt(self.attempts.started(rank, known, self._gone(known)), now)
            if known is not None and not known.from_env:
                self.store.drop_rank(known)     # a guess replaced: it never was a rank
            if known is not None and not self.exits.ended(known):
                self.exits.deaths.unwatch(known.pid)  # replaced, not dead (e.g. taken before its launcher forked)
            self.tracker.forget(rank.rank)
            self.ranks[rank.rank] = rank
            self.exits.forget(rank.rank)
            self.store.add_rank(rank, now)
            self.exits.deaths.watch(rank)
            if rank.from_env:   # a launched rank: the relay ends what is left in its session
                self.link.send(rank_pid=rank.pid)
            self.say(f"rank {rank.rank}: pid {rank.pid}{_known_as(rank)}")
        self._find_agentless(now)
        self._recover_restarts(now)
        ranks = self.found.claimed | {r.pid for r in self._live()}   # claims read this scan
        for line in self.ray_job.refresh(self.found.pids, ranks):
            self.say(line)

    def _gone(self, known: RankProcess | None) -> bool:
        """The rank's process ended (its exit recorded, or no longer in the job)."""
        return known is not None and (self.exits.ended(known) or not self._in_job(known.pid))

    def _begin_attempt(self, attempt: int, now: float) -> None:
        """New processes took the ranks' numbers after theirs ended (a restart): the findings
        made from now on say which attempt."""
        if self.ledger.begin_attempt(attempt, now):
            self.say(f"attempt {attempt}: the ranks run again, in new processes")

    def _find_agentless(self, now: float) -> None:
        """The ranks that run without the agent, and why: SD118 says each at once."""
        live = self._live()
        if self.agent_dir is not None and self.agentless.unsettled(live):
            self.agentless.check(now, live, self.agents_probe.pids_with_state(), self.parents)

    def _name_engines(self, engines: tuple[EngineProcess, ...]) -> None:
        """Say once what each vLLM engine process is (again when its owner becomes known): it
        is the work of its rank, never a rank."""
        for engine in engines:
            known = self.engines.get(engine.pid)
            if known is None or (known.owner is None and engine.owner is not None):
                self.engines[engine.pid] = engine
                self.say(f"{engine.title}: pid {engine.pid} (its rank's work, not a rank)")

    def _drop_guesses(self, found: tuple[RankProcess, ...]) -> None:
        """Forget a process under a number it no longer has: taken for the single rank 0 before
        processes claimed ranks (mp.spawn's parent, a Ray driver) and claiming none itself, or
        no longer taken for it while it lives on (it started a Ray node: a driver, whose workers
        have not joined a group yet), or renumbered (its world turned out one of several). Its
        records go with it. A guess that ended stays: its exit is rank 0's."""
        now_as = {r.pid: r.rank for r in found}
        claimed = any(r.from_env for r in found)
        for key, known in list(self.ranks.items()):
            number = now_as.get(known.pid, key if known.from_env else None)
            unguessed = not found and self._in_job(known.pid)   # lives on, no longer rank 0
            if number == key or (number is None and not claimed and not unguessed):
                continue
            del self.ranks[key]
            self.exits.forget(key)
            self.tracker.forget(key)
            self.exits.deaths.unwatch(known.pid)
            self.store.drop_rank(known)
            self.say(f"pid {known.pid} is not rank {key}: " + (
                f"it is rank {number}" if number is not None else
                "it claims no rank, the ranks are other processes"))

    def _in_job(self, pid: int) -> bool:
        """The process lives on in the job (this tick's process table says so)."""
        found = self.found
        info = found.table.get(pid) if found is not None and found.table is not None else None
        return found is not None and pid in found.pids and info is not None and not info.dead

    def _drain_logs(self) -> None:
        drained = self.logs.drain()
        self.sleep_log.feed(drained.lines)
        if drained.progress_at is not None:
            self.tracker.job_progressed(drained.progress_at)
        elif drained.counted_at is not None and len(self.ranks) == 1:
            self.tracker.job_progressed(drained.counted_at)   # a one-process job's step line
        self.store.add_logs(drained.lines)

    # ----- exits ------------------------------------------------------------------------------
    def _collect_exits(self, now: float, final: bool, job_code: int | None = None) -> None:
        """Record ranks that ended, with the best exit status known, and judge them.

        A status nobody saw (the launcher reaped the rank first) is taken from the launcher's
        report in the log, from the agent (an uncaught exception exits 1), or, once the launcher
        itself exited 0, is 0. Until then, unknown statuses alone raise no finding."""
        for exit in self.exits.seen():
            if of_present(exit, self.ranks):
                self.tracker.mark_dead(exit.rank)
        executors = {r.rank for r in self.ranks.values() if task_executor(r.cmdline)}
        new = self.exits.settle(now, final, job_code, executors, self._with_known_status)
        judged = self.exits.judged()
        if self.ending or not (new or final) or not judged:
            return
        if not final and all(e.exit_code is None for e in judged):
            return   # wait for the launcher's word
        self._report_exits(run_rules(self._window(time.time(), {}, None, every_exit=True),
                                     "exit"))

    def _report_exits(self, findings: list[Finding]) -> None:
        """Exit findings: each (rule, ranks) once; when later deaths add to one already made
        (collateral ranks that settled after the first), its stored summary is brought up to
        date instead of a second diagnosis."""
        findings = [self._exit_attempt(f) for f in findings]
        self._diagnosis(self._save(self.ledger.exits(time.time(), findings)))
        self._recover_restarts(time.time())

    def _exit_attempt(self, finding: Finding) -> Finding:
        """Once the ranks were restarted, an exit finding says the attempt its dead processes
        ran in (their exits may be judged after the next attempt began)."""
        if self.ledger.attempt == 1:
            return finding
        dead = finding.evidence.get("pid")
        pids = [dead] if isinstance(dead, int) else [e.pid for e in self.exits.for_rules()
                                                      if e.rank in finding.ranks]
        ran = [a for a in map(self.attempts.of_process, pids) if a is not None]
        attempt = max(ran, default=self.ledger.attempt)
        return in_attempt(finding, attempt)

    def _recover_restarts(self, now: float) -> None:
        """Exits the launcher recovered from: their ranks run again in new processes."""
        live = {r.rank: r.pid for r in self._live()}
        for entry in self._save(self.ledger.recovered(now, live)).resolved:
            self.say(f"resolved: {entry.finding.code} {entry.finding.summary}")

    def _with_known_status(self, exit: RankExit) -> RankExit:
        if exit.exit_code is not None:
            return exit
        reaped = self.link.reaped.get(exit.pid)
        if reaped is not None:
            code, sig = from_wait_status(reaped)
            return RankExit(exit.rank, exit.pid, exit.t, code, sig, "relay")
        returncode = self.logs.launcher_codes.get(exit.pid)
        if returncode is not None:
            status = (-returncode) if returncode < 0 else (returncode << 8)
            code, sig = from_wait_status(status)
            return RankExit(exit.rank, exit.pid, exit.t, code, sig, "launcher-log")
        agent = self.agents_probe.sample([self.ranks[exit.rank]]).get(exit.rank) \
            if exit.rank in self.ranks else None
        if agent is not None and agent.pid == exit.pid and agent.status == STATUS_EXCEPTION:
            return dataclasses.replace(exit, exit_code=1, source="agent")
        return exit

    # ----- stalls -----------------------------------------------------------------------------
    def _check_stall(self, now: float, agents: dict) -> None:
        if self.ending:   # what its ranks do as they are ended is no progress, nor a stall
            return
        awaiting = self.served.awaiting(self.engine_tick.idle,
                                        {e.owner for e in self.engines.values()})
        quiet = self.ray_job.quiet_since(now)
        started, ended = self.tracker.check(now, *self.cluster.elsewhere(now), awaiting, quiet)
        if ended is not None:
            self.store.save_stall(ended)
            self._save(self.ledger.stall_ended(now, ended.id))
            self.stall_over = True    # its stacks stay for this tick's rules (a line about it)
            self.say(f"progress resumed after stall #{ended.id}")
        if started is None:
            return
        self.store.save_stall(started)
        nothing = ("nothing in the job (its ranks, its driver and actors) showed work"
                   if started.outside else "no rank showed work")
        self.say(f"STALL #{started.id}: {nothing} for {now - started.started_at:.0f} s "
                 f"(threshold {started.threshold:.0f} s); {_grouped(started.work)}; taking "
                 f"stacks of {len(started.ranks)} rank(s)")
        self._diagnose(started, agents)
        if self.opts.on_stall == "kill":
            self.say("--on-stall kill: ending the job")
            self.killed_for_stall = True
            self.link.send(end_job="stall")

    def _diagnose(self, episode: StallEpisode, agents: dict) -> None:
        live = [self.ranks[r] for r in episode.ranks if r in self.ranks]
        self._ask_flight(live)
        stacks = self.stack_probe.capture_all(live, self.history.stopped_pids())
        self._explain_fallbacks(stacks.values())
        agents = self.agents_probe.sample(list(self.ranks.values())) or agents
        self._publish_node(time.time(), agents, stacks, (episode.id, True))
        self.cluster.await_stacks(self.cluster.wait_limit())
        flight = self._flight_dumps()
        now = time.time()
        peers = external_peers(live, self.parents.keys())
        window = dataclasses.replace(self._window(now, agents, episode, stacks),
                                     peers=peers, peer_servers=peer_servers(
                                         p for r, ps in peers.items() for p in ps
                                         if r in stacks and waits_on_http(server_wait(stacks[r]))),
                                     flight=flight, children=child_stacks(
                                         self.stack_probe, self.ranks, stacks, self.parents),
                                     build_locks=_build_locks(stacks.values()),
                                     engines=self._engine_states(live),
                                     served=self.served.view(self.engine_tick.idle,
                                                             episode.ranks),
                                     engine_settings=self._engine_settings(live),
                                     finished=self.agents_probe.finished(live),
                                     outside=self.ray_job.view(now, self.parents.keys())
                                     if episode.outside else None)
        self.store.add_stacks(episode.id, stacks.values())
        self.stall_stacks, self.stall_flight, self.stall_over = stacks, flight, False
        self._diagnosis(self._save(self.ledger.stall(now, episode.id,
                                                      run_rules(window, "stall"))))

    def _engine_settings(self, live: list[RankProcess]) -> dict[int, dict]:
        """The settings of the vLLM engine each live rank created in its own process."""
        found = {r.rank: read_engine_settings(self.agent_dir, r.pid) for r in live}
        return {rank: settings for rank, settings in found.items() if settings}

    def _engine_states(self, live: list[RankProcess]) -> tuple[EngineState, ...]:
        """The live ranks' vLLM engine processes, each with its state in this tick's table."""
        table = self.found.table if self.found is not None else None
        numbers = {r.rank for r in live}
        out = []
        for engine in self.engines.values():
            if engine.owner not in numbers:
                continue
            info = table.procs.get(engine.pid) if table is not None else None
            out.append(EngineState(engine, info.status if info is not None else "gone"))
        return tuple(out)

    def _ask_flight(self, live: list[RankProcess]) -> None:
        """Ask the live ranks' agents for Flight Recorder dumps (they come while stacks are
        taken); a failure here costs the dumps only."""
        if self.flight is None:
            return
        worlds = {r.world for r in self.ranks.values() if r.world_rank is not None}
        if len(worlds) > 1:   # each world's rank 0 would write rank_0: whose would be unknown
            self.say(f"flight recorder dumps not requested: the job holds {len(worlds)} "
                     "torch.distributed worlds, whose dumps torch names alike (rank_0...); "
                     "collectives are aligned from the agents' rings, world by world")
            self.flight.before = {}
            return
        try:
            self.flight.request({r.rank: r.pid for r in live})
        except OSError as exc:
            self.say(f"flight recorder dumps not requested: {exc.strerror or exc}")
            self.flight.before = {}

    def _flight_dumps(self) -> dict[int, FlightDump]:
        """The dumps that came (waiting at most FLIGHT_WAIT_SECONDS from the request)."""
        if self.flight is None or not self.flight.before:
            return {}
        dumps = self.flight.collect()
        asked = set(self.flight.before)
        if dumps:
            silent = f"; none from {join_ranks(asked - set(dumps))}" if asked - set(dumps) else ""
            self.say(f"flight recorder dumps of {join_ranks(dumps)}{silent}, to read: "
                     f"torchfrtrace {self.flight.flight_dir}")   # the directory said once
        for name, why in self.flight.skipped.items():
            self.say(f"flight recorder dump {name} not read: {why}")
        return dumps

    def _explain_fallbacks(self, stacks: Iterable[RankStacks]) -> None:
        """Say once per reason why some ranks' stacks did not come from py-spy."""
        by_reason: dict[str, list[int]] = {}
        for rank_stacks in stacks:
            if rank_stacks.error and rank_stacks.error not in self.explained:
                by_reason.setdefault(rank_stacks.error, []).append(rank_stacks.rank)
        for reason, ranks in by_reason.items():
            self.explained.add(reason)
            self.say(f"stacks of {join_ranks(ranks)} from the fallback: {reason}")

    def _window(self, now: float, agents: dict, episode: StallEpisode | None,
                stacks: dict | None = None, every_exit: bool = False) -> Window:
        """What the rules read now. The exits are those of the ranks' present processes, or,
        with ``every_exit`` (the exit rules), of every process that was a rank."""
        if not agents:
            agents = self.agents_probe.sample(list(self.ranks.values()))
        host, gpus, node, cuda = self.history.frozen()
        return Window(now, tuple(self.ranks.values()), agents, host, stacks or {},
                      self.exits.for_rules(None if every_exit else self.ranks), episode,
                      self.tracker.last_progress(),
                      tuple(self.logs.tail), gpus, node, tuple(self.logs.unread), {}, cuda,
                      self.config, work=self.tracker.work(), busy_timeout=self.opts.busy_timeout,
                      floor=self.opts.stall_timeout, vllm_sleep=self.sleep_log.states(),
                      cluster=self.cluster.view(now, agents, len(self.ranks)),
                      served=self.served.view(self.engine_tick.idle),
                      preemptions=self.preemptions.refresh(now, self.ranks.values(),
                                                           self.engines.values()),
                      agentless=self.agentless.view(self.ranks))

    def _launch_rules(self) -> list[Finding]:
        """What the command line says before anything runs; printed, never blocking."""
        try:
            gpus = self.sampler.nvml.sample(time.time()) if self.sampler.gpus_on else []
            checks = launch_checks(self.config, gpus, LAUNCH_CHECK_SECONDS)
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
            self._window(now, agents, self.tracker.episode, self.stall_stacks),
            flight=self.stall_flight,
            spinning=self.ray_job.spinning(now, self.opts.busy_timeout))
        self.logs.take_unread()
        if self.ending:
            return   # the ranks are being ended: their last moments (the lines they print
            # as they die, read by the last look too) are no new findings
        findings = run_rules(window, "tick")
        if final:
            findings = [f for f in findings if f.code in STICKY]
        changes = self._save(self.ledger.tick(now, findings, resolve=not final))
        if changes.opened:
            self.say("finding:\n" + render_findings(e.finding for e in changes.opened))
        for entry in changes.resolved:
            self.say(f"resolved: {entry.finding.code} {entry.finding.summary}")

    def _resolve_shutdown_lines(self, now: float) -> None:
        """The job exited 0: events made only of lines libraries also print at a normal
        shutdown (vLLM's "engine core died unexpectedly"), printed in its last
        ``SHUTDOWN_SECONDS``, were its shutdown, not a failure."""
        for entry in self._save(self.ledger.shutdown(now, now - SHUTDOWN_SECONDS)).resolved:
            self.say(f"resolved: {entry.finding.code} printed as the job shut down; it "
                     "exited 0")

    def _resolve_moved_on(self, now: float) -> None:
        """The job ended: state findings whose ranks all progressed after the last tick saw
        them (the agents' last words, a rank's exit 0) no longer hold."""
        progressed = latest_progress(self.agents_probe.sample(list(self.ranks.values())),
                                     self.exits.by_rank.values())
        for entry in self._save(self.ledger.moved_on(now, progressed,
                                                     ENDS_WITH_PROGRESS)).resolved:
            self.say(f"resolved: {entry.finding.code} {entry.finding.summary} (its ranks went "
                     "on before the job ended)")

    def _diagnosis(self, changes: Changes) -> None:
        """Print the findings a diagnosis (of a stall, of exits) opened."""
        if changes.opened:
            self.say("diagnosis:\n" + render_findings(e.finding for e in changes.opened))

    def _save(self, changes: Changes) -> Changes:
        """The ledger's changes, written to the store; returned for printing."""
        self.store.put_findings(changes.entries)
        return changes

    # ----- storage and status -----------------------------------------------------------------
    def _publish(self, now: float, sample: Tick) -> None:
        """The latest tick for the Prometheus exporter."""
        for gpu in sample.gpus:
            if gpu.memory_used is not None:
                self.gpu_peaks[gpu.index] = max(self.gpu_peaks.get(gpu.index, 0), gpu.memory_used)
        if self.exporter is None:
            return
        live = self.tracker.live()
        self.exporter.publish(MetricsState(
            self._run_id(), socket.gethostname(), job_name(self.config),
            {r: round(now - s.last_progress, 3) for r, s in live.items()},
            {r: s.phase for r, s in live.items()},
            {(r, g.name): g.started for r, a in sample.agents.items() for g in a.groups},
            {r: h.rss_bytes for r, h in sample.host.items()}, self.tracker.episode is not None,
            self.ledger.opened_counts(), sample.gpus, dict(self.gpu_peaks), sample.probes,
            self.ledger.open_counts(), self._node_name(),
            c10d_issued={r: a.c10d_issued for r, a in sample.agents.items() if a.c10d_issued}))

    def _run_id(self) -> str:
        """The job's run id: the shared run directory's name on every node of a multi-node job
        (Prometheus joins the nodes on it), else the run directory's."""
        return (self.opts.shared_dir or self.run_dir).name

    def _node_name(self) -> str:
        return self.opts.node if self.opts.shared_dir is not None else ""

    def _publish_node(self, now: float, agents: dict, stacks: dict | None = None,
                      stall: tuple[int, bool] | None = None, ended: bool = False) -> None:
        """This node's summary for the other nodes' watchers (multi-node jobs with a shared
        run directory): every tick, right after a stall's stacks, and at the end."""
        episode = self.tracker.episode
        if stall is None and episode is not None:
            stall = (episode.id, bool(self.stall_stacks))
        self.cluster.publish(LocalView(
            dict(self.ranks), self.tracker.work(), self.tracker.phases(), self.tracker.ages(now),
            agents, stacks if stacks is not None else self.stall_stacks,
            frozenset(self.tracker.dead) | self._ended()), stall, ended)

    def _ended(self) -> frozenset[int]:
        """The ranks whose present process ended."""
        return frozenset(r.rank for r in self.ranks.values() if self.exits.ended(r))

    def _say_cluster(self) -> None:
        shared = self.opts.shared_dir
        if shared is None:
            if self.opts.node:
                self.say(f"{self.cluster.label} of a multi-node job, without --run-dir: this "
                         "watcher cannot see the other nodes (give every node's `stalldoc "
                         "watch` the same --run-dir on a shared filesystem)")
            return
        of = f" of {self.opts.nnodes}" if self.opts.nnodes else ""
        self.say(f"{self.cluster.label}{of}: the other nodes' watchers meet in {shared} (give "
                 f"each node's `stalldoc watch` the same --run-dir)")
        self.store.set_meta("cluster", json.dumps({
            "node": self.opts.node, "label": self.cluster.label, "index": self.opts.node_index,
            "nnodes": self.opts.nnodes, "shared_dir": str(shared)}))

    def _status(self, now: float) -> None:
        tracker = self.tracker
        ranks = [RankLine(rank, now - state.last_progress, state.phase, rank in tracker.dead)
                 for rank, state in sorted(tracker.ranks.items())]
        episode = tracker.episode
        self.link.send(status=format_status(now - self.started_at, ranks, tracker.threshold(),
                                            episode.id if episode else None))

    def say(self, message: str) -> None:
        """A message for stalldoc's stderr (and sidecar.log once the relay is gone), redacted:
        some quote the job (findings, an unreadable config file, an internal error)."""
        self.link.send(say=redact_text(message))




def _weaker(found: RankProcess, known: RankProcess) -> bool:
    """``found`` claims the same rank less strongly than it was known by (its agent's claim not
    read this once, as a process in its exit is found by its launch alone): no news of it."""
    return (found.rank == known.rank and known.from_env
            and claim_strength(found.source) < claim_strength(known.source))


def _grouped(work: Mapping[int, RankWork], most: int = 4) -> str:
    """What the ranks showed, ranks that do the same (their stack's kind) together, a figure
    that differs between them the most any showed ('ranks 0,2-7: cpu up to 2%, io 0 kB/s, stack
    not sampled; rank 1: ...'), the largest groups first, ``most`` of them."""
    groups: dict[str, list[int]] = {}
    for rank, seen in sorted(work.items()):
        groups.setdefault(seen.stack_kind, []).append(rank)
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    shown = "; ".join(f"{join_ranks(ranks)}: {describe_together([work[r] for r in ranks])}"
                      for ranks in ordered[:most])
    rest = sum(len(ranks) for ranks in ordered[most:])
    return shown + (f"; {rest} more rank(s) otherwise" if rest else "")


def _known_as(rank: RankProcess) -> str:
    """How a rank is known, for the watcher's line: '' for RANK at start (the usual case); a
    job's single process, which claims no rank, is said to be one (rank 0 is no claim of it)."""
    if not rank.from_env:
        return " (a single process: it claims no rank)"
    where = (f" (world {rank.world} rank {rank.world_rank})" if rank.world_rank is not None
             else "")
    return where if rank.source in ("RANK", "") else f" ({rank.source}){where}"


def _build_locks(stacks: Iterable[RankStacks]) -> tuple[BuildLock, ...]:
    """The extension build locks of the ranks asleep on one (SD116), read only for them."""
    waiting = [s.pid for s in stacks if waits_on_build_lock(s.main) is not None]
    return build_locks(waiting) if waiting else ()
