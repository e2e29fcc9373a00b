"""Ranks that run without stalldoc's agent: a Python rank whose agent wrote no state file within
``GRACE`` seconds of its being found, with why (its interpreter's flags, its environment, a fork
of a process with the agent), kept for the rules (SD118 says each once)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from stalldoc.model.ranks import RankProcess
from stalldoc.probes.agent_absence import is_python, why_no_agent

GRACE = 3.0   # seconds from a rank's first sight: an interpreter starts its agent in milliseconds


@dataclass
class AgentlessRanks:
    bootstrap: str                                                      # the agent's sitecustomize
    seen: dict[tuple[int, int], float] = field(default_factory=dict)   # (rank, pid) -> first seen
    found: dict[int, tuple[int, str]] = field(default_factory=dict)    # rank -> (pid, why)
    with_agent: set[int] = field(default_factory=set)                  # rank pids that have one

    def unsettled(self, ranks: Iterable[RankProcess]) -> list[RankProcess]:
        """The ranks not yet known to have an agent or to have none."""
        return [r for r in ranks if r.pid not in self.with_agent
                and self.found.get(r.rank, (0, ""))[0] != r.pid]

    def check(self, now: float, ranks: Iterable[RankProcess], with_agent: set[int],
              parents: Mapping[int, int]) -> list[tuple[RankProcess, str]]:
        """The ranks newly found without an agent, with why; ``with_agent``: the processes
        with an agent state file now."""
        new = []
        for rank in self.unsettled(ranks):
            key = (rank.rank, rank.pid)
            if rank.pid in with_agent:
                self.with_agent.add(rank.pid)
                continue
            if now - self.seen.setdefault(key, now) < GRACE or not is_python(rank.pid):
                continue
            parent = parents.get(rank.pid, 0)
            why = (f"a fork of pid {parent}, whose agent a forked child does not carry (start "
                   "its ranks with spawn to have theirs)" if parent in with_agent
                   and _same_command(rank.pid, parent) else why_no_agent(rank.pid, self.bootstrap))
            self.found[rank.rank] = (rank.pid, why)
            new.append((rank, why))
        return new

    def view(self, ranks: Mapping[int, RankProcess]) -> dict[int, str]:
        """rank -> why, for the ranks whose present process is the one found without one."""
        return {n: why for n, (pid, why) in self.found.items()
                if n in ranks and ranks[n].pid == pid}


def _same_command(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as mine, \
                open(f"/proc/{parent}/cmdline", "rb") as theirs:
            return mine.read() == theirs.read()
    except OSError:
        return False
