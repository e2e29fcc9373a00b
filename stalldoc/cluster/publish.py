"""Write this node's summary (``cluster/summary.py``) into its node subdirectory of the shared
run directory, by atomic replacement: a reader on any host sees the old summary or the new one,
never half of one."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stalldoc.analysis.stacks import user_frame
from stalldoc.cluster.summary import SUMMARY_FILE, Published, encode
from stalldoc.detect.stack_kind import classify
from stalldoc.private_files import write_private_file
from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.cluster import RemoteRank
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import RankWork


class Publisher:
    """Writes the summaries; a write that fails is counted, never raised (the shared filesystem
    may be down: watching goes on, the other nodes will call this one silent)."""

    def __init__(self, node_dir: Path, node: str, label: str, host: str) -> None:
        self.node_dir, self.node, self.label, self.host = node_dir, node, label, host
        self.seq = 0
        self.errors = 0
        self.first_error = ""
        self.last: Published | None = None

    def write(self, ranks: tuple[RemoteRank, ...], world_size: int | None,
              stall: tuple[int, bool] | None, ended: bool = False) -> None:
        self.seq += 1
        self.last = Published(self.node, self.label, self.host, self.seq,
                              "ended" if ended else "running", world_size,
                              stall[0] if stall else None, bool(stall and stall[1]), ranks)
        self._write(self.last)

    def again(self) -> None:
        """The last summary once more, with a new sequence number: this watcher still speaks
        while a diagnosis holds its tick."""
        if self.last is not None:
            self.seq += 1
            self.last = dataclasses.replace(self.last, seq=self.seq)
            self._write(self.last)

    def _write(self, summary: Published) -> None:
        try:
            write_private_file(self.node_dir, SUMMARY_FILE, encode(summary))
        except OSError as exc:
            self.errors += 1
            self.first_error = self.first_error or (exc.strerror or str(exc))


@dataclass(frozen=True)
class LocalView:
    """This node's ranks as the progress model sees them now."""

    ranks: Mapping[int, RankProcess]
    work: Mapping[int, RankWork]
    phases: Mapping[int, str]
    ages: Mapping[int, tuple[float, float]]   # seconds since work, since progress
    agents: Mapping[int, AgentSnapshot]
    stacks: Mapping[int, RankStacks]          # the stall's, when one was diagnosed
    dead: frozenset[int]


def local_ranks(label: str, local: LocalView) -> tuple[RemoteRank, ...]:
    """This node's ranks as the other nodes see them."""
    out = []
    for rank, process in sorted(local.ranks.items()):
        work = local.work.get(rank)
        agent = local.agents.get(rank)
        frame, kind = _where(local.stacks.get(rank), work,
                             agent.phase_thread if agent is not None else 0)
        work_age, progress_age = local.ages.get(rank, (0.0, 0.0))
        out.append(RemoteRank(
            rank, label, process.pid, local.phases.get(rank, ""),
            work.verdict if work else "idle", work_age, progress_age, rank in local.dead,
            frame, kind, agent.groups if agent is not None else ()))
    return tuple(out)


def _where(stacks: RankStacks | None, work: RankWork | None,
           phase_thread: int = 0) -> tuple[str, str]:
    """(frame, stack kind): from the stall's stacks when taken (the kind as the tracker reads it:
    the main thread and the phase's), else the last classified one."""
    main = stacks.main if stacks is not None else None
    if stacks is not None and main is not None:
        frame = user_frame(main)
        return (str(frame) if frame else ""), classify(stacks, phase_thread).kind
    if work is not None:
        return work.frame, work.stack_kind
    return "", ""
