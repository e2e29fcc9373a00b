"""Which processes are ranks, how each rank is known (its claim), and how a rank ended."""
from __future__ import annotations

from dataclasses import dataclass


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
# hands a process it starts (its place in the tree, as exact as RANK)
CLAIM_STRENGTH = {"process group": 3, "RANK": 2, "Lightning": 2}


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
        return CLAIM_STRENGTH.get(self.source, 1)


@dataclass(frozen=True)
class RankExit:
    """A rank that ended: how, and when we saw it."""

    rank: int
    pid: int
    t: float
    exit_code: int | None       # shell convention: 128+N for signal N; None if unknown
    signal: int | None
    source: str                 # "waitpid", "proc", "launcher-log", "agent", "unknown"
