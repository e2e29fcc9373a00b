"""The ranks' exits judged: each death the exit book settled (``exits.py``) gets the best status
known, the exit rules read them, their findings say the attempt their processes ran in, and
exits the launcher recovered from (their ranks run again) are resolved. Once the job ended, the
findings its end undoes are resolved too: its shutdown's lines, and state findings whose ranks
went on before it ended."""
from __future__ import annotations

import dataclasses
import time

from stalldoc.agent.statefile import STATUS_EXCEPTION
from stalldoc.detect.progress import latest_progress
from stalldoc.findings.ledger import in_attempt
from stalldoc.model.findings import Finding
from stalldoc.model.ranks import RankExit
from stalldoc.probes.exits import from_wait_status
from stalldoc.probes.process_tree import task_executor
from stalldoc.rules import ENDS_WITH_PROGRESS, run_rules
from stalldoc.sidecar.context import Context, Sources
from stalldoc.sidecar.exits import of_present
from stalldoc.sidecar.roster import Roster
from stalldoc.sidecar.windows import Windows

SHUTDOWN_SECONDS = 60.0   # an event only libraries' shutdown also prints, this close to a clean exit


class ExitJudge:
    """Judges the exits the exit book records, with the exit rules."""

    def __init__(self, ctx: Context, sources: Sources, roster: Roster, windows: Windows) -> None:
        self.ctx = ctx
        self.sources = sources
        self.roster = roster
        self.windows = windows

    def collect(self, now: float, final: bool, job_code: int | None = None) -> None:
        """Record ranks that ended, with the best exit status known, and judge them.

        A status nobody saw (the launcher reaped the rank first) is taken from the launcher's
        report in the log, from the agent (an uncaught exception exits 1), or, once the launcher
        itself exited 0, is 0. Until then, unknown statuses alone raise no finding."""
        exits, ranks = self.ctx.exits, self.roster.ranks
        for exit in exits.seen():
            if of_present(exit, ranks):
                self.ctx.tracker.mark_dead(exit.rank)
        executors = {r.rank for r in ranks.values() if task_executor(r.cmdline)}
        new = exits.settle(now, final, job_code, executors, self.with_known_status)
        judged = exits.judged()
        if self.ctx.ending or not (new or final) or not judged:
            return
        if not final and all(e.exit_code is None for e in judged):
            return   # wait for the launcher's word
        self._report(run_rules(self.windows.window(time.time(), {}, None, every_exit=True),
                               "exit"))

    def _report(self, findings: list[Finding]) -> None:
        """Exit findings: each (rule, ranks) once; when later deaths add to one already made
        (collateral ranks that settled after the first), its stored summary is brought up to
        date instead of a second diagnosis."""
        findings = [self._in_its_attempt(f) for f in findings]
        self.ctx.diagnosis(self.ctx.save(self.ctx.ledger.exits(time.time(), findings)))
        self.recover_restarts(time.time())

    def _in_its_attempt(self, finding: Finding) -> Finding:
        """Once the ranks were restarted, an exit finding says the attempt its dead processes
        ran in (their exits may be judged after the next attempt began)."""
        ledger = self.ctx.ledger
        if ledger.attempt == 1:
            return finding
        dead = finding.evidence.get("pid")
        pids = [dead] if isinstance(dead, int) else [e.pid for e in self.ctx.exits.for_rules()
                                                      if e.rank in finding.ranks]
        ran = [a for a in map(self.roster.attempts.of_process, pids) if a is not None]
        attempt = max(ran, default=ledger.attempt)
        return in_attempt(finding, attempt)

    def recover_restarts(self, now: float) -> None:
        """Exits the launcher recovered from: their ranks run again in new processes."""
        live = {r.rank: r.pid for r in self.roster.live()}
        self.ctx.say_resolved(self.ctx.save(self.ctx.ledger.recovered(now, live)))

    def with_known_status(self, exit: RankExit) -> RankExit:
        """The exit with the best status known for it: the relay's wait, the launcher's word in
        the log, or the agent's (an uncaught exception)."""
        if exit.exit_code is not None:
            return exit
        reaped = self.ctx.link.reaped.get(exit.pid)
        if reaped is not None:
            code, sig = from_wait_status(reaped)
            return RankExit(exit.rank, exit.pid, exit.t, code, sig, "relay")
        returncode = self.sources.logs.launcher_codes.get(exit.pid)
        if returncode is not None:
            status = (-returncode) if returncode < 0 else (returncode << 8)
            code, sig = from_wait_status(status)
            return RankExit(exit.rank, exit.pid, exit.t, code, sig, "launcher-log")
        ranks = self.roster.ranks
        agent = self.sources.sampler.agents.sample([ranks[exit.rank]]).get(exit.rank) \
            if exit.rank in ranks else None
        if agent is not None and agent.pid == exit.pid and agent.status == STATUS_EXCEPTION:
            return dataclasses.replace(exit, exit_code=1, source="agent")
        return exit

    def resolve_shutdown_lines(self, now: float) -> None:
        """The job exited 0: events made only of lines libraries also print at a normal
        shutdown (vLLM's "engine core died unexpectedly"), printed in its last
        ``SHUTDOWN_SECONDS``, were its shutdown, not a failure."""
        ctx = self.ctx
        for entry in ctx.save(ctx.ledger.shutdown(now, now - SHUTDOWN_SECONDS)).resolved:
            ctx.say(f"resolved: {entry.finding.code} printed as the job shut down; it "
                    "exited 0")

    def resolve_moved_on(self, now: float) -> None:
        """The job ended: state findings whose ranks all progressed after the last tick saw
        them (the agents' last words, a rank's exit 0) no longer hold."""
        ctx, ranks = self.ctx, self.roster.ranks
        progressed = latest_progress(self.sources.sampler.agents.sample(list(ranks.values())),
                                     ctx.exits.by_rank.values())
        for entry in ctx.save(ctx.ledger.moved_on(now, progressed,
                                                  ENDS_WITH_PROGRESS)).resolved:
            ctx.say(f"resolved: {entry.finding.code} {entry.finding.summary} (its ranks went "
                    "on before the job ended)")
