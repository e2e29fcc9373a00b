"""A rollout engine's own processes among the job's: its workers (vLLM's workers, SGLang's
schedulers: they joined a process group the engine's own code created: their agent's claim,
``agent/identity.engine_world``) and the engine core that started them (their parent, when it
is neither a rank nor a worker). They are the work
of the rank above them, never ranks: their TP/PP world is the engine's, not the job's."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from stalldoc import engines
from stalldoc.model.ranks import ENGINE_SOURCES, EngineProcess, RankClaim
from stalldoc.probes.host import rank_of
from stalldoc.probes.proc_table import ProcessTable


def engine_claims(claims: Mapping[int, RankClaim]) -> dict[int, RankClaim]:
    """The claims that make their process an engine's worker."""
    return {pid: claim for pid, claim in claims.items() if claim.source in ENGINE_SOURCES}


def engine_pids(workers: Mapping[int, RankClaim], pids: Sequence[int], table: ProcessTable,
                ranks: Iterable[int] = ()) -> set[int]:
    """The workers and their engine cores (a worker's parent in the job that is no rank), for
    an engine that runs a core process of its own (vLLM's EngineCore). SGLang's schedulers are
    children of the process that holds the engine (the user's program, a Ray actor): that one
    is the job's, never the engine's."""
    job, ranks = set(pids), set(ranks)
    cores = {table.ppid(pid) for pid, claim in workers.items()
             if _engine(claim.source).core_process} & job
    return set(workers) | (cores - ranks - set(workers))


def _engine(source: str) -> engines.Engine:
    return engines.by_claim(source) or engines.VLLM


def engine_processes(workers: Mapping[int, RankClaim], pids: Sequence[int],
                     table: ProcessTable, rank_numbers: Mapping[int, int]
                     ) -> tuple[EngineProcess, ...]:
    """Each engine process with its role and the rank (by number) whose engine it is."""
    out, parents = [], {pid: table.ppid(pid) for pid in pids}
    # an engine core is its workers' engine's
    sources = {**{parents.get(pid): c.source for pid, c in workers.items()},
               **{pid: c.source for pid, c in workers.items()}}
    for pid in sorted(engine_pids(workers, pids, table, rank_numbers)):
        claim = workers.get(pid)
        owner = rank_of(pid, rank_numbers, parents)   # an engine process is never a rank
        engine = _engine(sources.get(pid, ""))
        names = {"engine": engine.name, "worker_noun": engine.worker, "core_noun": engine.core}
        if claim is not None:
            out.append(EngineProcess(pid, "worker", owner, claim.rank, claim.world_size, **names))
        else:
            out.append(EngineProcess(pid, "engine core", owner, **names))
    return tuple(out)

