"""Agent probe: read the state file of every rank that has one."""
from __future__ import annotations

import os

from stalldoc.agent.statefile import AgentSnapshot, StateFileError, read_state, state_path
from stalldoc.model import RankProcess


class AgentStateProbe:
    name = "agent"

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def pids_with_state(self) -> set[int]:
        """Processes that started an agent (whether or not they are ranks)."""
        if not self.directory or not os.path.isdir(self.directory):
            return set()
        pids = set()
        for name in os.listdir(self.directory):
            if name.startswith("agent-") and name.endswith(".state"):
                try:
                    pids.add(int(name[len("agent-"):-len(".state")]))
                except ValueError:
                    continue
        return pids

    def sample(self, ranks: list[RankProcess]) -> dict[int, AgentSnapshot]:
        """Rank → its agent's state; ranks without a readable state file are left out."""
        if not self.directory:
            return {}
        out = {}
        for rank in ranks:
            try:
                out[rank.rank] = read_state(state_path(self.directory, rank.pid))
            except (OSError, StateFileError):
                continue
        return out
