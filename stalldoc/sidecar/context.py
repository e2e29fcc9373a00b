"""What the watcher's parts share (``watcher.py`` builds it and hands it to each part): the
options, the relay link, the run store, the ledger of findings, the progress tracker, the exit
book, and the few things that change as the watch goes on; and ``Sources``, the probes and feeds
the parts read the job from. Neither is the watcher: no part imports ``watcher.py``."""
from __future__ import annotations

import time
from dataclasses import dataclass

from stalldoc.detect.progress import ProgressTracker
from stalldoc.detect.vllm_sleep import SleepLog
from stalldoc.findings.ledger import Changes, Ledger
from stalldoc.launch.config import LaunchConfig
from stalldoc.probes.pyspy import StackProbe
from stalldoc.redact import redact_text
from stalldoc.report.text import render_findings
from stalldoc.rules import SETTLE, STICKY
from stalldoc.run.options import WatchOptions
from stalldoc.sidecar.agentless import AgentlessRanks
from stalldoc.sidecar.cluster import NodeCluster
from stalldoc.sidecar.engine_progress import EngineTick
from stalldoc.sidecar.exits import ExitBook
from stalldoc.sidecar.history import Histories
from stalldoc.sidecar.link import RelayLink
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.sidecar.preemptions import PreemptionWatch
from stalldoc.sidecar.ray_job import RayJob
from stalldoc.sidecar.sampling import Sampler
from stalldoc.sidecar.served import ServedRanks
from stalldoc.store.db import RunStore


# after the user's interrupt (Ctrl-C), how long the job's ranks ending is the user's doing: a
# launcher passes the signal on and waits for its workers (torchrun: up to 30 s, then SIGKILL)
INTERRUPT_GRACE = 60.0


def say_on(link: RelayLink, message: str) -> None:
    """A message for stalldoc's stderr (and sidecar.log once the relay is gone), redacted:
    some quote the job (findings, an unreadable config file, an internal error)."""
    link.send(say=redact_text(message))


class Context:
    """The watch's shared state. ``opts`` may be replaced while it runs (attach's --follow
    does), so the parts read it here each time rather than keep their own."""

    def __init__(self, options: WatchOptions, link: RelayLink) -> None:
        assert options.run_dir is not None   # the relay made it
        self.opts = options
        self.link = link
        self.run_dir = options.run_dir
        self.store = RunStore(self.run_dir)
        self.agent_dir = str(self.run_dir / "agents") if options.agent else None
        self.tracker = ProgressTracker(options.stall_timeout)
        self.exits = ExitBook(self.store)   # ranks that ended; its death watch
        self.ledger = Ledger(STICKY, SETTLE)   # every finding of the run
        self.config: LaunchConfig | None = None
        self.engine_tick = EngineTick()     # this tick's vLLM engines' work (the watcher's)
        self.killed_for_stall = False       # --on-stall kill ended the job

    @property
    def ending(self) -> bool:
        """The job is being ended on purpose: its ranks' deaths are ours, not findings; or the
        user interrupted it (Ctrl-C, forwarded to the job) less than ``INTERRUPT_GRACE`` ago:
        what ends then is theirs (a job that caught the interrupt and went on is judged again
        after that)."""
        interrupted = self.link.interrupted_at
        return self.link.ending or self.killed_for_stall or (
            interrupted is not None and time.time() - interrupted < INTERRUPT_GRACE)

    def say(self, message: str) -> None:
        say_on(self.link, message)

    def save(self, changes: Changes) -> Changes:
        """The ledger's changes, written to the store; returned for printing."""
        self.store.put_findings(changes.entries)
        return changes

    def diagnosis(self, changes: Changes) -> None:
        """Print the findings a diagnosis (of a stall, of exits) opened."""
        if changes.opened:
            self.say("diagnosis:\n" + render_findings(e.finding for e in changes.opened))

    def say_resolved(self, changes: Changes) -> None:
        """Say each finding the changes resolved, and what it said."""
        for entry in changes.resolved:
            self.say(f"resolved: {entry.finding.code} {entry.finding.summary}")


@dataclass(frozen=True)
class Sources:
    """The probes and feeds the watch reads the job from, built once by the watcher."""

    sampler: Sampler                  # processes, host, GPUs, agents' state files
    stack_probe: StackProbe
    history: Histories
    logs: LogFeed                     # the job's output, from the relay
    sleep_log: SleepLog               # vLLM engines' sleep state from their log lines
    served: ServedRanks               # ranks that serve HTTP, their vLLM metrics
    preemptions: PreemptionWatch      # their engines' full KV caches
    agentless: AgentlessRanks         # ranks without an agent
    cluster: NodeCluster              # the other nodes of a multi-node job
    ray_job: RayJob                   # a Ray job's driver and actors
