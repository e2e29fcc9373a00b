"""A rollout engine's own processes among the job's: vLLM's workers (they joined a process group
vLLM created for the engine: their agent's claim, ``agent/identity.engine_world``) and the engine
core that started them (their parent, when it is neither a rank nor a worker). They are the work
of the rank above them, never ranks: their TP/PP world is the engine's, not the job's."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from stalldoc.model.ranks import ENGINE_SOURCE, EngineProcess, RankClaim
from stalldoc.probes.host import rank_of
from stalldoc.probes.proc_table import ProcessTable


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
    out, parents = [], {pid: table.ppid(pid) for pid in pids}
    for pid in sorted(engine_pids(workers, pids, table, rank_numbers)):
        claim = workers.get(pid)
        owner = rank_of(pid, rank_numbers, parents)   # an engine process is never a rank
        if claim is not None:
            out.append(EngineProcess(pid, "worker", owner, claim.rank, claim.world_size))
        else:
            out.append(EngineProcess(pid, "engine core", owner))
    return tuple(out)

