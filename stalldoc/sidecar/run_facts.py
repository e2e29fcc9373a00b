"""What the run directory's meta records of the job beside its ticks: the versions its ranks
published, the agent's start-up cost per Python process, watch's own exit code and who ended
the job; and the sweep that forgets ended processes' agent state files (counting their start-up
costs first)."""
from __future__ import annotations

import json
from typing import Collection

from stalldoc.model.ranks import RankProcess
from stalldoc.probes.agent_state import AgentStateProbe, StartupCosts
from stalldoc.probes.versions import RunVersions
from stalldoc.sidecar.context import Context

SWEEP_SECONDS = 5.0


class RunFacts:
    def __init__(self, ctx: Context, agents: AgentStateProbe, versions: RunVersions) -> None:
        self.ctx = ctx
        self.agents = agents
        self.versions = versions
        self.startup_costs = StartupCosts()
        self.swept_at = 0.0

    def sweep(self, now: float, ranks: Collection[RankProcess]) -> None:
        """Every few seconds: forget the state files of ended processes that were not ranks."""
        if now - self.swept_at >= SWEEP_SECONDS:
            self.swept_at = now
            self.agents.sweep({r.pid for r in ranks}, self.startup_costs)
            self.store_versions(ranks)

    def store_versions(self, ranks: Collection[RankProcess], final: bool = False) -> None:
        """The versions a rank published, once it has (``probes/versions.py``)."""
        found = self.versions.update(ranks, final)
        if found is not None:
            self.ctx.store.set_meta("versions", json.dumps(found))

    def store_startup_costs(self, ranks: Collection[RankProcess]) -> None:
        """The agent's start-up cost per Python process of the job (ranks and the rest)."""
        self.agents.sweep({r.pid for r in ranks}, self.startup_costs)
        for snapshot in self.agents.sample(list(ranks)).values():
            if snapshot.identity is not None:
                self.startup_costs.add(snapshot.identity.startup_seconds)
        summary = self.startup_costs.summary()
        if summary is not None:
            self.ctx.store.set_meta("agent_startup", json.dumps(summary))

    def store_exit_codes(self) -> None:
        """watch's own exit code and who ended the job, as the relay told (unknown, and not
        stored, when the relay was killed: then no code reached the shell from it)."""
        link = self.ctx.link
        if link.watch_code is not None:
            self.ctx.store.set_meta("watch_exit_code", str(link.watch_code))
            self.ctx.store.set_meta("ended_by", link.ended_by)
