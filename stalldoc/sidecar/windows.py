"""What the rules read (``model/window.py``'s ``Window``), made from the watch's sources as they
stand: the tick rules, the exit rules and a stall's diagnosis each ask for one."""
from __future__ import annotations

from stalldoc.model.window import Window
from stalldoc.model.work import StallEpisode
from stalldoc.sidecar.context import Context, Sources
from stalldoc.sidecar.roster import Roster


class Windows:
    """Makes the rules' windows from the watch's shared state, its sources and its roster."""

    def __init__(self, ctx: Context, sources: Sources, roster: Roster) -> None:
        self.ctx = ctx
        self.sources = sources
        self.roster = roster

    def window(self, now: float, agents: dict, episode: StallEpisode | None,
               stacks: dict | None = None, every_exit: bool = False) -> Window:
        """What the rules read now. The exits are those of the ranks' present processes, or,
        with ``every_exit`` (the exit rules), of every process that was a rank."""
        ctx, sources, ranks = self.ctx, self.sources, self.roster.ranks
        if not agents:
            agents = sources.sampler.agents.sample(list(ranks.values()))
        host, gpus, node, cuda = sources.history.frozen()
        logs, tracker = sources.logs, ctx.tracker
        return Window(now, tuple(ranks.values()), agents, host, stacks or {},
                      ctx.exits.for_rules(None if every_exit else ranks), episode,
                      tracker.last_progress(),
                      tuple(logs.tail), gpus, node, tuple(logs.unread), {}, cuda,
                      ctx.config, work=tracker.work(), busy_timeout=ctx.opts.busy_timeout,
                      floor=ctx.opts.stall_timeout, vllm_sleep=sources.sleep_log.states(),
                      cluster=sources.cluster.view(now, agents, len(ranks)),
                      served=sources.served.view(ctx.engine_tick.idle),
                      preemptions=sources.preemptions.refresh(now, ranks.values(),
                                                              self.roster.engines.values()),
                      agentless=sources.agentless.view(ranks),
                      kinds=sources.history.kind_reads(),
                      generation=sources.history.generation_samples())
