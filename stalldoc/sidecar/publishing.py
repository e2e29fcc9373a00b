"""What the watch tells the world as it goes: the Prometheus exporter's metrics, this node's
summary for the other nodes' watchers (multi-node jobs with a shared run directory), its card
for the watches beside it (a trainer's, for a rollout server's watch: ``sidecar/peer_card.py``),
and the terminal's live status line."""
from __future__ import annotations

import json
import socket
from typing import Mapping

from stalldoc.analysis.phase_shares import StepShares
from stalldoc.cluster.publish import LocalView
from stalldoc.model.stacks import RankStacks
from stalldoc.run.terminal import RankLine, format_status
from stalldoc.sidecar.cluster import NodeCluster
from stalldoc.sidecar.context import Context
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.sidecar.metrics import Exporter, MetricsState, job_name
from stalldoc.sidecar.peer_card import PeerCard
from stalldoc.sidecar.roster import Roster
from stalldoc.sidecar.sampling import Tick


class Publisher:
    """The metrics, the node's summary and the status line, each tick."""

    def __init__(self, ctx: Context, roster: Roster, cluster: NodeCluster, logs: LogFeed) -> None:
        self.ctx = ctx
        self.roster = roster
        self.cluster = cluster
        self.logs = logs
        self.card = PeerCard(ctx.run_dir, ctx.opts.argv)
        self.exporter: Exporter | None = None
        self.gpu_peaks: dict[int, int] = {}

    def open_exporter(self) -> None:
        """The metrics server, when a port was asked for (a port taken raises
        ``StalldocError``)."""
        opts = self.ctx.opts
        if opts.metrics_port is not None:
            self.exporter = Exporter(opts.metrics_port, opts.metrics_addr,
                                     MetricsState(self.run_id(), socket.gethostname(),
                                                  job_name(self.ctx.config),
                                                  node_name=self.node_name()))

    def publish(self, now: float, sample: Tick,
                shares: Mapping[int, StepShares] | None = None) -> None:
        """The latest tick for the Prometheus exporter, with each rank's shares of its last
        cycles by kind of phase."""
        for gpu in sample.gpus:
            if gpu.memory_used is not None:
                self.gpu_peaks[gpu.index] = max(self.gpu_peaks.get(gpu.index, 0), gpu.memory_used)
        if self.exporter is None:
            return
        tracker, ledger = self.ctx.tracker, self.ctx.ledger
        live = tracker.live()
        self.exporter.publish(MetricsState(
            self.run_id(), socket.gethostname(), job_name(self.ctx.config),
            {r: round(now - s.last_progress, 3) for r, s in live.items()},
            {r: s.phase for r, s in live.items()},
            {(r, g.name): g.started for r, a in sample.agents.items() for g in a.groups},
            {r: h.rss_bytes for r, h in sample.host.items()}, tracker.episode is not None,
            ledger.opened_counts(), sample.gpus, dict(self.gpu_peaks), sample.probes,
            ledger.open_counts(), self.node_name(),
            c10d_issued={r: a.c10d_issued for r, a in sample.agents.items() if a.c10d_issued},
            shares=dict(shares or {})))

    def publish_card(self, now: float, ended: bool = False, code: int | None = None) -> None:
        """This watch's card for the watches beside it, when due (and once at the end)."""
        if not (ended or self.card.due(now)):
            return
        found = self.roster.found
        self.card.write(now, found.pids if found is not None else (),
                        self.ctx.ledger.open_entries(), self.logs.raised,
                        self.ctx.tracker.episode is not None, ended, code)

    def run_id(self) -> str:
        """The job's run id: the shared run directory's name on every node of a multi-node job
        (Prometheus joins the nodes on it), else the run directory's."""
        return (self.ctx.opts.shared_dir or self.ctx.run_dir).name

    def node_name(self) -> str:
        opts = self.ctx.opts
        return opts.node if opts.shared_dir is not None else ""

    def publish_node(self, now: float, agents: dict, stacks: dict[int, RankStacks],
                     stall: tuple[int, bool] | None = None, ended: bool = False) -> None:
        """This node's summary for the other nodes' watchers (multi-node jobs with a shared
        run directory): every tick (``stacks``: the stall's, if any), right after a stall's
        stacks, and at the end."""
        tracker = self.ctx.tracker
        episode = tracker.episode
        if stall is None and episode is not None:
            stall = (episode.id, bool(stacks))
        self.cluster.publish(LocalView(
            dict(self.roster.ranks), tracker.work(), tracker.phases(), tracker.ages(now),
            agents, stacks, frozenset(tracker.dead) | self._ended()), stall, ended)

    def _ended(self) -> frozenset[int]:
        """The ranks whose present process ended."""
        return frozenset(r.rank for r in self.roster.ranks.values() if self.ctx.exits.ended(r))

    def say_cluster(self) -> None:
        """Say where the other nodes' watchers meet (and store it), or that none can."""
        opts, say = self.ctx.opts, self.ctx.say
        shared = opts.shared_dir
        if shared is None:
            if opts.node:
                say(f"{self.cluster.label} of a multi-node job, without --run-dir: this "
                    "watcher cannot see the other nodes (give every node's `stalldoc "
                    "watch` the same --run-dir on a shared filesystem)")
            return
        of = f" of {opts.nnodes}" if opts.nnodes else ""
        say(f"{self.cluster.label}{of}: the other nodes' watchers meet in {shared} (give "
            f"each node's `stalldoc watch` the same --run-dir)")
        self.ctx.store.set_meta("cluster", json.dumps({
            "node": opts.node, "label": self.cluster.label, "index": opts.node_index,
            "nnodes": opts.nnodes, "shared_dir": str(shared)}))

    def status(self, now: float, started_at: float) -> None:
        """The terminal's live line: each rank's time since progress, the stall if any."""
        tracker = self.ctx.tracker
        ranks = [RankLine(rank, now - state.last_progress, state.phase, rank in tracker.dead)
                 for rank, state in sorted(tracker.ranks.items())]
        episode = tracker.episode
        self.ctx.link.send(status=format_status(now - started_at, ranks, tracker.threshold(),
                                                episode.id if episode else None))

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()

