"""Ranks that ended, as the watcher keeps them: each death the death watch saw
(``probes/exits.py``), settled for a moment so the launcher's report of it can arrive, given the
best exit status known, and recorded once. A Ray worker's exit waits for the job's end: Ray ends
its workers when the driver shuts down, with status 1 as often as 0, so once the job has exited
0 a non-zero status seen from them is the driver's shutdown (``DRIVER_SHUTDOWN``), not a
failure."""
from __future__ import annotations

import dataclasses
from typing import Callable, Collection, Mapping

from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.probes.exits import DeathWatch
from stalldoc.store.db import RunStore

EXIT_SETTLE_SECONDS = 2.0   # wait this long after a death for the launcher's report of it
DRIVER_SHUTDOWN = "driver shutdown"   # a Ray worker's exit status while its job ended with 0


def of_present(exit: RankExit, present: Mapping[int, RankProcess]) -> bool:
    """Whether the exit is of its rank's present process (or of a rank no process holds now),
    not of one that a restart has replaced since."""
    process = present.get(exit.rank)
    return process is None or process.pid == exit.pid


class ExitBook:
    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.deaths = DeathWatch()
        self.by_rank: dict[int, RankExit] = {}   # recorded, by rank
        self.pending: list[RankExit] = []        # seen, not settled yet
        self.held: list[RankExit] = []           # Ray workers': judged when the job has ended

    def seen(self) -> list[RankExit]:
        """Deaths the watch saw since the last call (their statuses may come later)."""
        new = self.deaths.drain()
        self.pending += new
        return new

    def settle(self, now: float, final: bool, job_code: int | None, executors: Collection[int],
               known: Callable[[RankExit], RankExit]) -> list[RankExit]:
        """Record the deaths that have settled (all of them when ``final``), each with the status
        ``known`` finds for it; the ones recorded now. Once the launcher itself exited 0, a
        status nobody saw is 0."""
        settled = final or (self.pending and now - self.pending[0].t >= EXIT_SETTLE_SECONDS)
        new = self.pending if settled else []
        self.pending = [] if settled else self.pending
        new = self._hold_executors(new, final, job_code, executors, known)
        for exit in new:
            self.record(known(exit))
        if final and job_code == 0:
            for exit in [e for e in self.by_rank.values() if e.exit_code is None]:
                self.record(dataclasses.replace(exit, exit_code=0, source="launcher"))
        return new

    def _hold_executors(self, new: list[RankExit], final: bool, job_code: int | None,
                        executors: Collection[int], known: Callable[[RankExit], RankExit]
                        ) -> list[RankExit]:
        self.held += [e for e in new if e.rank in executors]
        new = [e for e in new if e.rank not in executors]
        if not final:
            return new
        held = [known(e) for e in self.held]
        self.held = []
        return new + [dataclasses.replace(e, source=DRIVER_SHUTDOWN)
                      if job_code == 0 and e.exit_code not in (0, None) else e for e in held]

    def record(self, exit: RankExit) -> None:
        self.by_rank[exit.rank] = exit
        self.store.rank_exit(exit)

    def ended(self, rank: RankProcess) -> bool:
        """Whether this process of the rank ended: its exit is recorded. An exit recorded for
        the rank number is another process's once the rank was restarted (torchrun's agent
        starts the new ranks within the settle time of the old ones' deaths)."""
        exit = self.by_rank.get(rank.rank)
        return exit is not None and exit.pid == rank.pid

    def judged(self) -> list[RankExit]:
        """Recorded exits that may be failures (not 0, not a driver's shutdown)."""
        return [e for e in self.by_rank.values()
                if e.exit_code != 0 and e.source != DRIVER_SHUTDOWN]

    def for_rules(self, present: Mapping[int, RankProcess] | None = None
                  ) -> tuple[RankExit, ...]:
        """What the rules see: every exit, unsettled ones too, but no driver's shutdown;
        with ``present`` (each rank's process now), only the exits of those processes: a stall
        of restarted ranks is not the first attempt's failure."""
        ended = {**self.by_rank, **{e.rank: e for e in self.pending}}
        return tuple(e for e in ended.values() if e.source != DRIVER_SHUTDOWN
                     and (present is None or of_present(e, present)))

    def forget(self, rank: int) -> None:
        """A rank number taken by another process (a restart, a guess replaced)."""
        self.by_rank.pop(rank, None)

    def close(self) -> None:
        self.deaths.close()
