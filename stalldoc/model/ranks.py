"""Which processes are ranks, how each rank is known (its claim), and how a rank ended."""
from __future__ import annotations

from dataclasses import dataclass

from stalldoc.model.stacks import RankStacks


@dataclass(frozen=True)
class RankProcess:
    """A process of the job that is a rank (not a launcher, not a rank's own worker)."""

    rank: int
    pid: int
    local_rank: int | None
    cmdline: tuple[str, ...]
    from_env: bool = True   # claimed by the process (False: the guessed single-process rank 0)
    source: str = "RANK"    # how its rank is known (RankClaim.source); "" for the guess
    world: str = ""         # its torch.distributed world (the store's address); "" unknown
    world_rank: int | None = None   # its rank in that world when ``rank`` numbers several


# any other source (a launcher's variable): 1; "Lightning": the rank Lightning's own launcher
# hands a process it starts (its place in the tree, as exact as RANK); "vLLM engine": vLLM's
# own world for its engine's workers (the process is no rank, whatever its environment says)
ENGINE_SOURCE = "vLLM engine"
# every rollout engine's own world (stalldoc/engines lists them; model imports no other package)
ENGINE_SOURCES = (ENGINE_SOURCE, "SGLang engine")
CLAIM_STRENGTH = {**{source: 4 for source in ENGINE_SOURCES}, "process group": 3, "RANK": 2,
                  "Lightning": 2}


def claim_strength(source: str) -> int:
    """How strongly a claim of ``source`` says which rank a process is (any other: 1)."""
    return CLAIM_STRENGTH.get(source, 1)


@dataclass(frozen=True)
class EngineProcess:
    """A process of a vLLM engine: a worker (it joined the engine's own TP/PP world) or the
    engine core that started workers. It is the work of the rank that started it (``owner``,
    that rank's number; None when no rank of the job is above it, e.g. ``vllm serve``
    watched alone), never a rank itself."""

    pid: int
    role: str                      # "worker" or "engine core"
    owner: int | None = None
    tp_rank: int | None = None     # a worker's rank in the engine's world
    world_size: int | None = None
    engine: str = "vLLM"           # which engine (stalldoc/engines: its name)
    worker_noun: str = "worker"    # what that engine calls a worker ("scheduler": SGLang)
    core_noun: str = "engine core"  # and the process that started them ("engine": SGLang)

    @property
    def title(self) -> str:
        """As a user knows it: "vLLM worker (TP rank 1) of rank 0's engine", "rank 0's vLLM
        engine core", "the vLLM engine core" (no rank above it), "SGLang scheduler (TP rank 1)
        of rank 0's engine"."""
        if self.role == "worker":
            place = f" (TP rank {self.tp_rank})" if self.tp_rank is not None else ""
            whose = f"rank {self.owner}'s engine" if self.owner is not None else "its engine"
            return f"{self.engine} {self.worker_noun}{place} of {whose}"
        core = f"{self.engine} {self.core_noun}"
        return f"rank {self.owner}'s {core}" if self.owner is not None else f"the {core}"


@dataclass(frozen=True)
class RankClaim:
    """Which rank a process says it is: from the process group it created, from RANK, or from
    a launcher's variable (SLURM_PROCID, OMPI_COMM_WORLD_RANK, ...), with that rank's world."""

    source: str
    rank: int
    local_rank: int | None = None
    world_size: int | None = None
    world: str = ""

    @property
    def strength(self) -> int:
        """3 from the process group, 2 from RANK or Lightning's tree, 1 from a launcher's
        variable."""
        return claim_strength(self.source)


@dataclass(frozen=True)
class RankExit:
    """A rank that ended: how, and when we saw it."""

    rank: int
    pid: int
    t: float
    exit_code: int | None       # shell convention: 128+N for signal N; None if unknown
    signal: int | None
    source: str                 # "waitpid", "proc", "launcher-log", "agent", "unknown"


STOPPED = ("stopped", "tracing stop")   # the process table's words for a stopped process


@dataclass(frozen=True)
class EngineState:
    """An engine process as a stall found it: its state ("running", "sleeping", "stopped",
    "zombie", "gone", as the process table says), and for a broken one still there, its stacks
    (read without pausing it; None where not read)."""

    process: EngineProcess
    state: str
    stacks: RankStacks | None = None

    @property
    def broken(self) -> bool:
        """Stopped, dead or gone: the engine cannot answer its rank."""
        return self.state in STOPPED or self.state in ("zombie", "dead", "gone")

    @property
    def stopped(self) -> bool:
        """Stopped, still there: it runs on once continued."""
        return self.state in STOPPED


@dataclass(frozen=True)
class EnginePreemptions:
    """The requests a rank's vLLM engines preempted (thrown out of a full KV cache, to be
    computed again), as their agents counted them: ``total`` so far, ``recent`` within the last
    ``seconds``."""

    rank: int
    total: int
    recent: int
    seconds: float
