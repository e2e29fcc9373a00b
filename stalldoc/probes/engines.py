"""A rollout engine's own processes among the job's: vLLM's workers (they joined a process group
vLLM created for the engine: their agent's claim, ``agent/identity.engine_world``) and the engine
core that started them (their parent, when it is neither a rank nor a worker). They are the work
of the rank above them, never ranks: their TP/PP world is the engine's, not the job's."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from stalldoc.model.ranks import ENGINE_SOURCE, EngineProcess, RankClaim
from stalldoc.probes.proc_table import ProcessTable

_DEPTH = 64   # how far up the tree an owner is looked for (a table read in passes may loop)


def engine_claims(claims: Mapping[int, RankClaim]) -> dict[int, RankClaim]:
    """The claims that make their process an engine's worker."""
    return {pid: claim for pid, claim in claims.items() if claim.source == ENGINE_SOURCE}


def engine_pids(workers: Iterable[int], pids: Sequence[int], table: ProcessTable,
                ranks: Iterable[int] = ()) -> set[int]:
    """The workers and their engine cores (a worker's parent in the job that is no rank)."""
    workers, job, ranks = set(workers), set(pids), set(ranks)
    cores = {table.ppid(pid) for pid in workers} & job
    return workers | (cores - ranks - workers)


def engine_processes(workers: Mapping[int, RankClaim], pids: Sequence[int],
                     table: ProcessTable, rank_numbers: Mapping[int, int]
                     ) -> tuple[EngineProcess, ...]:
    """Each engine process with its role and the rank (by number) whose engine it is."""
    out = []
    for pid in sorted(engine_pids(workers, pids, table, rank_numbers)):
        claim = workers.get(pid)
        owner = _owner(pid, table, rank_numbers)
        if claim is not None:
            out.append(EngineProcess(pid, "worker", owner, claim.rank, claim.world_size))
        else:
            out.append(EngineProcess(pid, "engine core", owner))
    return tuple(out)


def _owner(pid: int, table: ProcessTable, rank_numbers: Mapping[int, int]) -> int | None:
    """The number of the nearest rank above ``pid``."""
    pid, seen = table.ppid(pid), 0
    while pid and seen < _DEPTH:
        if pid in rank_numbers:
            return rank_numbers[pid]
        pid, seen = table.ppid(pid), seen + 1
    return None
