"""The preemptions of the ranks' vLLM engines, tick after tick: each rank's engine cores (and
the rank itself, where its engine runs in its own process: colocated, or without vLLM's
multiprocessing) count the requests their scheduler threw out of a full KV cache
(``probes/preemptions.py``). Read every few seconds, kept for a minute: how many came lately is
what tells an engine that thrashes from one that once ran short."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from stalldoc.model.ranks import EnginePreemptions, EngineProcess, RankProcess
from stalldoc.probes.preemptions import read_preemptions

RECENT = 60.0      # seconds over which the recent preemptions are counted
READ_EVERY = 5.0   # seconds between two reads of the counts


@dataclass
class PreemptionWatch:
    directory: str | None
    last_read: float = float("-inf")
    history: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    current: dict[int, EnginePreemptions] = field(default_factory=dict)

    def refresh(self, now: float, ranks: Iterable[RankProcess],
                engines: Iterable[EngineProcess]) -> dict[int, EnginePreemptions]:
        """Each rank whose engines preempted a request so far, with how many lately."""
        if not self.directory or now - self.last_read < READ_EVERY:
            return self.current
        self.last_read = now
        totals: dict[int, int] = {}
        pids = [(r.rank, r.pid) for r in ranks]
        pids += [(e.owner, e.pid) for e in engines
                 if e.role == "engine core" and e.owner is not None]
        for rank, pid in pids:
            count = read_preemptions(self.directory, pid)
            if count:
                totals[rank] = totals.get(rank, 0) + count
        self.current = {rank: self._counted(now, rank, total) for rank, total in totals.items()}
        return self.current

    def _counted(self, now: float, rank: int, total: int) -> EnginePreemptions:
        samples = self.history.setdefault(rank, deque())
        samples.append((now, total))
        while len(samples) > 1 and samples[1][0] <= now - RECENT:
            samples.popleft()   # keep one sample from before the window: its count is the base
        base = samples[0][1] if samples[0][0] <= now - RECENT else 0
        return EnginePreemptions(rank, total, max(0, total - base), RECENT)
