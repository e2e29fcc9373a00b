"""Which attempt of the job runs: 1 until its launcher restarts the ranks (torchrun
``--max-restarts``, an elastic agent, a Ray Train worker group after a failure), then 2, ...

A rank number taken by a new process after the one that had it ended is that rank's next
attempt (a job that starts a second world of the same ranks after its first ended, a second
``mp.spawn``, counts so too: its processes cannot tell it from a restart); the job's attempt is
the latest of its ranks'. Where torchrun says it (``TORCHELASTIC_RESTART_COUNT`` in every
worker's environment: the restarts so far), that is the attempt, also for a rank it starts anew
on a restart (a scale-up). A guess replaced (the single-process rank 0 before the ranks claimed
theirs) is no restart."""
from __future__ import annotations

from typing import Callable

from stalldoc.model.ranks import RankProcess
from stalldoc.probes.proc_table import read_environment

RESTART_COUNT = b"TORCHELASTIC_RESTART_COUNT"


def restart_count(pid: int, proc: str = "/proc") -> int | None:
    """torchrun's count of restarts before this worker started; None where it says none."""
    env = read_environment(pid, (RESTART_COUNT,), proc)
    value = (env or {}).get(RESTART_COUNT, b"")
    return int(value) if value.isdigit() else None


class Attempts:
    """Each rank's attempt, from the processes that took its number in turn."""

    def __init__(self, restarts: Callable[[int], int | None] = restart_count) -> None:
        self._restarts = restarts
        self._of_rank: dict[int, int] = {}
        self._of_pid: dict[int, int] = {}

    @property
    def current(self) -> int:
        """The job's attempt: its latest rank's."""
        return max(self._of_rank.values(), default=1)

    def started(self, rank: RankProcess, replaced: RankProcess | None, ended: bool) -> int:
        """``rank``'s process took its number, from ``replaced`` (None: first seen), which had
        ``ended``; the job's attempt after it."""
        counted = self._of_rank.get(rank.rank, 1)
        if (replaced is not None and replaced.from_env and replaced.pid != rank.pid
                and ended):
            counted += 1
        told = self._restarts(rank.pid) if rank.from_env else None
        self._of_rank[rank.rank] = self._of_pid[rank.pid] = \
            told + 1 if told is not None else counted
        return self.current

    def of_process(self, pid: int) -> int | None:
        """The attempt a rank's process ran in; None for a process never a rank."""
        return self._of_pid.get(pid)
