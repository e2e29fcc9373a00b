"""Who is who in the job, as the watcher knows it: its ranks (and the guesses it made before they
claimed their numbers), their vLLM engines, its processes' parents, the ranks without an agent,
which attempt runs (the launcher may restart the ranks), and a Ray job's driver and actors.

Each discovery scans the process table once (``sampling.py``) and returns what it learned for
the watcher to say and to tell the relay; the store hears of every rank added or dropped."""
from __future__ import annotations

import os
from dataclasses import dataclass

from stalldoc.model.ranks import EngineProcess, RankProcess, claim_strength
from stalldoc.run.job import JobTree
from stalldoc.sidecar.attempts import Attempts
from stalldoc.sidecar.context import Context, Sources
from stalldoc.sidecar.sampling import Discovery


@dataclass(frozen=True)
class Discovered:
    """What one discovery learned: the lines to say, in order, and the pids of the ranks the
    launcher started since (the relay ends what is left in their sessions)."""

    lines: tuple[str, ...] = ()
    launched: tuple[int, ...] = ()


class Roster:
    """The job's ranks and engines, from one table scan a tick."""

    def __init__(self, ctx: Context, sources: Sources) -> None:
        self.ctx = ctx
        self.sources = sources
        self.ranks: dict[int, RankProcess] = {}
        self.engines: dict[int, EngineProcess] = {}   # vLLM engine processes, as last said
        self.parents: dict[int, int] = {}
        self.found: Discovery | None = None   # this tick's processes, from one table scan
        self.attempts = Attempts()          # which attempt: the launcher may restart the ranks

    def discover(self, now: float, job: JobTree) -> Discovered:
        """Which processes of ``job`` are the ranks now, and their engines."""
        # once ranks with RANK were seen, the job is distributed: no single-process fallback
        distributed = any(r.from_env for r in self.ranks.values())
        self.found = self.sources.sampler.discover(job, os.getpid(), not distributed)
        self.parents = self.found.parents
        lines = self._drop_guesses(self.found.ranks)
        lines += self._name_engines(self.found.engines)
        for rank, url in self.sources.served.refresh(self.found.ranks, self.parents):
            lines.append(f"rank {rank} serves {url}: requests are its work, and while its "
                         "engine waits for them it is not stalled")
        for pid, rank, url in self.sources.served.fresh_parts:
            lines.append(f"pid {pid} below rank {rank} serves {url}: a server of the job's, "
                         f"not rank {rank}'s serving (a rank of the job is judged by its own "
                         "work)" if rank is not None else
                         f"pid {pid} serves {url}: a server of the job's, below no rank")
        launched: list[int] = []
        for rank in self.found.ranks:
            known = self.ranks.get(rank.rank)
            if known is not None and known.pid == rank.pid:
                lines += self._told(rank, known)
                continue
            lines += self._begin_attempt(self.attempts.started(rank, known, self._gone(known)),
                                         now)
            self._take(rank, known, now)
            if rank.from_env:   # a launched rank: the relay ends what is left in its session
                launched.append(rank.pid)
            lines.append(f"rank {rank.rank}: pid {rank.pid}{_known_as(rank)}")
        self._find_agentless(now)
        return Discovered(tuple(lines), tuple(launched))

    def refresh_outside(self, now: float) -> list[str]:
        """The Ray part learns the driver, the actors and the task workers among this scan's
        processes (the ranks, and the processes whose agent claims one this scan, are not
        theirs) and reads their CPU from its table; what to say of the new ones."""
        if self.found is None:
            return []
        ranks = self.found.claimed | {r.pid for r in self.live()}   # claims read this scan
        return self.sources.ray_job.refresh(self.found.pids, ranks, now, self.found.table)

    def live(self) -> list[RankProcess]:
        """The ranks whose present process has not ended."""
        return [r for r in self.ranks.values() if not self.ctx.exits.ended(r)]

    def ending(self) -> set[int]:
        """Ranks whose process is ending (a zombie, or gone from this tick's process table)
        while the death watch has not seen its last thread go."""
        table = self.found.table if self.found is not None else None
        if table is None:
            return set()
        return {r.rank for r in self.live() if r.pid not in table or table.procs[r.pid].dead}

    def _told(self, rank: RankProcess, known: RankProcess) -> list[str]:
        """A known rank's process again: what it says of itself since, if it says more."""
        if known == rank or _weaker(rank, known):
            return []
        self.ranks[rank.rank] = rank
        self.ctx.store.update_rank(rank)
        if rank.from_env > known.from_env or (rank.world_rank is not None
                                              and known.world_rank is None):
            return [f"rank {rank.rank}: pid {rank.pid}{_known_as(rank)}"]
        return []

    def _take(self, rank: RankProcess, known: RankProcess | None, now: float) -> None:
        """A new process holds the rank's number: it replaces ``known``'s records."""
        exits = self.ctx.exits
        if known is not None and not known.from_env:
            self.ctx.store.drop_rank(known)     # a guess replaced: it never was a rank
        if known is not None and not exits.ended(known):
            exits.deaths.unwatch(known.pid)  # replaced, not dead (e.g. taken before its launcher forked)
        self.ctx.tracker.forget(rank.rank)
        self.ranks[rank.rank] = rank
        exits.forget(rank.rank)
        self.ctx.store.add_rank(rank, now)
        exits.deaths.watch(rank)

    def _gone(self, known: RankProcess | None) -> bool:
        """The rank's process ended (its exit recorded, or no longer in the job)."""
        return known is not None and (self.ctx.exits.ended(known) or not self._in_job(known.pid))

    def _begin_attempt(self, attempt: int, now: float) -> list[str]:
        """New processes took the ranks' numbers after theirs ended (a restart): the findings
        made from now on say which attempt."""
        if self.ctx.ledger.begin_attempt(attempt, now):
            return [f"attempt {attempt}: the ranks run again, in new processes"]
        return []

    def _find_agentless(self, now: float) -> None:
        """The ranks that run without the agent, and why: SD118 says each at once."""
        live = self.live()
        agentless = self.sources.agentless
        if self.ctx.agent_dir is not None and agentless.unsettled(live):
            agentless.check(now, live, self.sources.sampler.agents.pids_with_state(),
                            self.parents)

    def _name_engines(self, engines: tuple[EngineProcess, ...]) -> list[str]:
        """Say once what each vLLM engine process is (again when its owner becomes known): it
        is the work of its rank, never a rank."""
        lines = []
        for engine in engines:
            known = self.engines.get(engine.pid)
            if known is None or (known.owner is None and engine.owner is not None):
                self.engines[engine.pid] = engine
                lines.append(f"{engine.title}: pid {engine.pid} (its rank's work, not a rank)")
        return lines

    def _drop_guesses(self, found: tuple[RankProcess, ...]) -> list[str]:
        """Forget a process under a number it no longer has: taken for the single rank 0 before
        processes claimed ranks (mp.spawn's parent, a Ray driver) and claiming none itself, or
        no longer taken for it while it lives on (it started a Ray node: a driver, whose workers
        have not joined a group yet), or renumbered (its world turned out one of several). Its
        records go with it. A guess that ended stays: its exit is rank 0's."""
        now_as = {r.pid: r.rank for r in found}
        claimed = any(r.from_env for r in found)
        lines = []
        for key, known in list(self.ranks.items()):
            number = now_as.get(known.pid, key if known.from_env else None)
            unguessed = not found and self._in_job(known.pid)   # lives on, no longer rank 0
            if number == key or (number is None and not claimed and not unguessed):
                continue
            del self.ranks[key]
            self.ctx.exits.forget(key)
            self.ctx.tracker.forget(key)
            self.ctx.exits.deaths.unwatch(known.pid)
            self.ctx.store.drop_rank(known)
            lines.append(f"pid {known.pid} is not rank {key}: " + (
                f"it is rank {number}" if number is not None else
                "it claims no rank, the ranks are other processes"))
        return lines

    def _in_job(self, pid: int) -> bool:
        """The process lives on in the job (this tick's process table says so)."""
        found = self.found
        info = found.table.get(pid) if found is not None and found.table is not None else None
        return found is not None and pid in found.pids and info is not None and not info.dead


def _weaker(found: RankProcess, known: RankProcess) -> bool:
    """``found`` claims the same rank less strongly than it was known by (its agent's claim not
    read this once, as a process in its exit is found by its launch alone): no news of it."""
    return (found.rank == known.rank and known.from_env
            and claim_strength(found.source) < claim_strength(known.source))


def _known_as(rank: RankProcess) -> str:
    """How a rank is known, for the watcher's line: '' for RANK at start (the usual case); a
    job's single process, which claims no rank, is said to be one (rank 0 is no claim of it)."""
    if not rank.from_env:
        return " (a single process: it claims no rank)"
    where = (f" (world {rank.world} rank {rank.world_rank})" if rank.world_rank is not None
             else "")
    return where if rank.source in ("RANK", "") else f" ({rank.source}){where}"
