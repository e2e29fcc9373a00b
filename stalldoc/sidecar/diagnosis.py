"""Stalls and their diagnosis: the tracker's decision each tick (``detect``), and for a stall
its ranks' stacks, Flight Recorder dumps, engines and peers, read by the stall rules. The
stall's stacks and dumps stay for the tick rules until the stall ends."""
from __future__ import annotations

import dataclasses
import socket
import time
from typing import Iterable, Mapping

from stalldoc.analysis.stacks import (engine_code, server_wait, waits_on_build_lock,
                                      waits_on_http)
from stalldoc.cluster.peer_card import endpoints_of, matching, read_cards
from stalldoc.model.collectives import FlightDump
from stalldoc.model.kernel import KernelWait
from stalldoc.model.peer_watch import PeerWatch
from stalldoc.model.ranks import EngineState, RankProcess
from stalldoc.model.stacks import BuildLock, RankStacks
from stalldoc.model.window import Window
from stalldoc.model.work import RankWork, StallEpisode, describe_together
from stalldoc.probes.build_locks import build_locks
from stalldoc.probes.connections import external_peers, socket_table
from stalldoc.probes.kernel_wait import kernel_wait
from stalldoc.probes.engine_settings import read_engine_settings
from stalldoc.probes.flight_dumps import FlightDumps
from stalldoc.rules import run_rules
from stalldoc.rules.base import join_ranks
from stalldoc.run.inject import FLIGHT_DIR
from stalldoc.sidecar.children import child_stacks
from stalldoc.sidecar.context import Context, Sources
from stalldoc.sidecar.publishing import Publisher
from stalldoc.sidecar.roster import Roster
from stalldoc.sidecar.job_servers import waited_servers
from stalldoc.sidecar.served import peer_servers
from stalldoc.sidecar.windows import Windows


# the engine processes a stall reads where they stand beside its ranks (a colocated job's 8 ranks
# each with an engine core and a worker: 16 reads of about 0.1 s)
ENGINE_READS = 16


class Diagnosis:
    """The stall decision each tick, and the diagnosis of each stall."""

    def __init__(self, ctx: Context, sources: Sources, roster: Roster, windows: Windows,
                 publisher: Publisher) -> None:
        self.ctx = ctx
        self.sources = sources
        self.roster = roster
        self.windows = windows
        self.publisher = publisher
        self.flight = FlightDumps(ctx.run_dir / "agents", ctx.run_dir / FLIGHT_DIR) \
            if ctx.opts.agent and ctx.opts.flight_recorder else None
        self.explained: set[str] = set()
        self.stall_stacks: dict[int, RankStacks] = {}   # taken at its diagnosis, for tick rules
        self.stall_flight: dict[int, FlightDump] = {}   # the Flight Recorder dumps, likewise
        self.stall_over = False   # the stall ended this tick: its stacks go after the tick rules

    def check_stall(self, now: float, agents: dict) -> None:
        """Whether a stall began or ended this tick; a new one is said, diagnosed, and with
        --on-stall kill the job is ended."""
        ctx, sources = self.ctx, self.sources
        if ctx.ending:   # what its ranks do as they are ended is no progress, nor a stall
            return
        awaiting = sources.served.awaiting(ctx.engine_tick.idle,
                                           {e.owner for e in self.roster.engines.values()})
        quiet = sources.ray_job.quiet_since(now)
        started, ended = ctx.tracker.check(now, *sources.cluster.elsewhere(now), awaiting, quiet)
        if ended is not None:
            ctx.store.save_stall(ended)
            ctx.save(ctx.ledger.stall_ended(now, ended.id))
            self.stall_over = True    # its stacks stay for this tick's rules (a line about it)
            ctx.say(f"progress resumed after stall #{ended.id}")
        if started is None:
            return
        ctx.store.save_stall(started)
        nothing = ("nothing in the job (its ranks, its driver and actors) showed work"
                   if started.outside else "no rank showed work")
        shown = f"{_grouped(started.work)}; " if started.work else ""
        taking = (f"taking stacks of {len(started.ranks)} rank(s)" if started.ranks else
                  "no rank known: taking stacks of its driver and actors")
        ctx.say(f"STALL #{started.id}: {nothing} for {now - started.started_at:.0f} s "
                f"(threshold {started.threshold:.0f} s); {shown}{taking}")
        self._diagnose(started, agents)
        if ctx.opts.on_stall == "kill":
            ctx.say("--on-stall kill: ending the job")
            ctx.killed_for_stall = True
            ctx.link.send(end_job="stall")

    def forget_ended_stall(self) -> None:
        """A stall that ended this tick: its stacks and dumps served this tick's rules (a
        watchdog line printed as the ranks died names the frames seen in the stall); now they
        go."""
        if self.stall_over:
            self.stall_stacks, self.stall_flight, self.stall_over = {}, {}, False

    def _diagnose(self, episode: StallEpisode, agents: dict) -> None:
        """The stall's stacks (and dumps) taken, published for the other nodes, stored, and
        read by the stall rules; their findings printed."""
        ranks, sources = self.roster.ranks, self.sources
        live = [ranks[r] for r in episode.ranks if r in ranks]
        self._ask_flight(live)
        stacks = sources.stack_probe.capture_all(live, sources.history.stopped_pids())
        self._explain_fallbacks(stacks.values())
        agents = sources.sampler.agents.sample(list(ranks.values())) or agents
        self.publisher.publish_node(time.time(), agents, stacks, (episode.id, True))
        sources.cluster.await_stacks(sources.cluster.wait_limit())
        flight = self._flight_dumps()
        now = time.time()
        window = self._stall_window(now, agents, episode, live, stacks, flight)
        self.ctx.store.add_stacks(episode.id, stacks.values())
        self.stall_stacks, self.stall_flight, self.stall_over = stacks, flight, False
        self.ctx.diagnosis(self.ctx.save(self.ctx.ledger.stall(now, episode.id,
                                                               run_rules(window, "stall"))))

    def _stall_window(self, now: float, agents: dict, episode: StallEpisode,
                      live: list[RankProcess], stacks: dict[int, RankStacks],
                      flight: dict[int, FlightDump]) -> Window:
        """What the stall rules read: the tick's window with the stall's stacks, its ranks'
        peers and children, dumps, engines, and the job outside the ranks when it is stalled
        as a whole."""
        sources, parents = self.sources, self.roster.parents
        peers = external_peers(live, parents.keys())
        return dataclasses.replace(
            self.windows.window(now, agents, episode, stacks),
            peers=peers, peer_servers=peer_servers(
                p for r, ps in peers.items() for p in ps
                if r in stacks and waits_on_http(server_wait(stacks[r]))),
            flight=flight, kernel=blocked_in(live), children=child_stacks(
                sources.stack_probe, self.roster.ranks, stacks, parents),
            build_locks=_build_locks(stacks.values()),
            engines=self._engine_states(live, stacks),
            served=sources.served.view(self.ctx.engine_tick.idle, episode.ranks),
            job_servers=waited_servers(sources.served, live, stacks, sources.stack_probe),
            engine_settings=self._engine_settings(live),
            finished=sources.sampler.agents.finished(live),
            outside=sources.ray_job.view(now, parents.keys()) if episode.outside else None,
            peer_watches=self._peer_watches(live, agents, peers))

    def _peer_watches(self, live: list[RankProcess], agents: dict,
                      peers: Mapping[int, tuple[str, ...]]) -> dict[int, PeerWatch]:
        """For each rank in a weight-sync, rollout or reward call, the watch beside this one
        whose job serves what it waits on (its card, ``cluster/peer_card.py``)."""
        waiting = {r.rank: endpoints_of(agents.get(r.rank), peers.get(r.rank, ()),
                                        self.ctx.config) for r in live}
        waiting = {rank: found for rank, found in waiting.items() if found}
        if not waiting:
            return {}
        cards = read_cards(self.ctx.run_dir, self.ctx.opts.shared_dir)
        host = socket.gethostname()
        matched = {rank: matching(cards, found, host) for rank, found in waiting.items()}
        return {rank: card for rank, card in matched.items() if card is not None}

    def _engine_settings(self, live: list[RankProcess]) -> dict[int, dict]:
        """The settings of the vLLM engine each live rank created in its own process."""
        found = {r.rank: read_engine_settings(self.ctx.agent_dir, r.pid) for r in live}
        return {rank: settings for rank, settings in found.items() if settings}

    def _engine_states(self, live: list[RankProcess],
                       stacks: Mapping[int, RankStacks]) -> tuple[EngineState, ...]:
        """The live ranks' vLLM engine processes, each with its state in this tick's table. A
        stopped one is read where it stands (py-spy, without pausing it), and so is each
        running or sleeping process of an engine its rank waits for (the rank's main thread in
        the engine's code): where they stand is where the rank's wait goes on (at most
        ``ENGINE_READS`` of those a stall)."""
        found = self.roster.found
        table = found.table if found is not None else None
        numbers = {r.rank for r in live}
        waiting = {r for r, s in stacks.items() if engine_code(s.main)}
        out, reads = [], 0
        for engine in self.roster.engines.values():
            if engine.owner not in numbers:
                continue
            info = table.procs.get(engine.pid) if table is not None else None
            state = EngineState(engine, info.status if info is not None else "gone")
            read = state.stopped or (engine.owner in waiting and not state.broken
                                     and reads < ENGINE_READS)
            reads += read and not state.stopped
            out.append(self._read_where(state) if read else state)
        return tuple(out)

    def _read_where(self, state: EngineState) -> EngineState:
        process = state.process
        stacks = self.sources.stack_probe.capture(
            RankProcess(-process.pid, process.pid, None, ()), True, nonblocking=True,
            fallback=False)
        return dataclasses.replace(state, stacks=stacks if stacks.threads else None)

    def _ask_flight(self, live: list[RankProcess]) -> None:
        """Ask the live ranks' agents for Flight Recorder dumps (they come while stacks are
        taken); a failure here costs the dumps only."""
        if self.flight is None:
            return
        worlds = {r.world for r in self.roster.ranks.values() if r.world_rank is not None}
        if len(worlds) > 1:   # each world's rank 0 would write rank_0: whose would be unknown
            self.ctx.say(f"flight recorder dumps not requested: the job holds {len(worlds)} "
                         "torch.distributed worlds, whose dumps torch names alike (rank_0...); "
                         "collectives are aligned from the agents' rings, world by world")
            self.flight.before = {}
            return
        try:
            self.flight.request({r.rank: r.pid for r in live})
        except OSError as exc:
            self.ctx.say(f"flight recorder dumps not requested: {exc.strerror or exc}")
            self.flight.before = {}

    def _flight_dumps(self) -> dict[int, FlightDump]:
        """The dumps that came (waiting at most FLIGHT_WAIT_SECONDS from the request)."""
        if self.flight is None or not self.flight.before:
            return {}
        dumps = self.flight.collect()
        asked = set(self.flight.before)
        if dumps:
            silent = f"; none from {join_ranks(asked - set(dumps))}" if asked - set(dumps) else ""
            self.ctx.say(f"flight recorder dumps of {join_ranks(dumps)}{silent}, to read: "
                         f"torchfrtrace {self.flight.flight_dir}")   # the directory said once
        for name, why in self.flight.skipped.items():
            self.ctx.say(f"flight recorder dump {name} not read: {why}")
        return dumps

    def _explain_fallbacks(self, stacks: Iterable[RankStacks]) -> None:
        """Say once per reason why some ranks' stacks did not come from py-spy."""
        by_reason: dict[str, list[int]] = {}
        for rank_stacks in stacks:
            if rank_stacks.error and rank_stacks.error not in self.explained:
                by_reason.setdefault(rank_stacks.error, []).append(rank_stacks.rank)
        for reason, ranks in by_reason.items():
            self.explained.add(reason)
            self.ctx.say(f"stacks of {join_ranks(ranks)} from the fallback: {reason}")


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


def _build_locks(stacks: Iterable[RankStacks]) -> tuple[BuildLock, ...]:
    """The extension build locks of the ranks asleep on one (SD116), read only for them."""
    waiting = [s.pid for s in stacks if waits_on_build_lock(s.main) is not None]
    return build_locks(waiting) if waiting else ()


def blocked_in(live: list[RankProcess]) -> dict[int, KernelWait]:
    """Rank -> the system call its main thread is blocked in (ranks that run, or that cannot be
    read, are left out); the TCP socket table read once for all of them."""
    sockets = socket_table()
    return {rank.rank: wait for rank in live
            if (wait := kernel_wait(rank.pid, sockets)) is not None}
