"""The rank's own processes it waits on: on a stall, a rank whose main thread waits on its
DataLoader workers, a multiprocessing pool, a child process or a subprocess is only the
messenger; the stacks of those children (py-spy, each in parallel, at most MAX_CHILDREN per rank)
say where the wait really is (a worker deadlocked after fork on a lock copied while held, a
``__getitem__`` that never returns, a tool that hangs)."""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

from stalldoc.analysis.stacks import child_wait
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import RankStacks
from stalldoc.probes.pyspy import StackProbe

MAX_CHILDREN = 8


def waited_children(ranks: Mapping[int, RankProcess], stacks: Mapping[int, RankStacks],
                    parents: Mapping[int, int]) -> dict[int, list[int]]:
    """Rank -> the pids of its child processes, for each rank whose stack waits on them."""
    out = {}
    for rank, rank_stacks in stacks.items():
        process = ranks.get(rank)
        if process is None or not waits_on_children(rank_stacks):
            continue
        pids = sorted(pid for pid, parent in parents.items() if parent == process.pid)
        if pids:
            out[rank] = pids[:MAX_CHILDREN]
    return out


def waits_on_children(stacks: RankStacks) -> bool:
    """Whether the rank's main thread sits in a wait on its own processes: a frame of the
    DataLoader's fetch from its workers, a pool's result, a child's join, a subprocess's wait
    (the innermost frames may be the select / poll under them)."""
    return bool(child_wait(stacks.main))


def child_stacks(probe: StackProbe, ranks: Mapping[int, RankProcess],
                 stacks: Mapping[int, RankStacks], parents: Mapping[int, int]
                 ) -> dict[int, tuple[RankStacks, ...]]:
    """Rank -> the stacks of the children it waits on (no faulthandler fallback: a signal to a
    process that is not a rank, and has no agent, could end it)."""
    wanted = [(rank, pid) for rank, pids in waited_children(ranks, stacks, parents).items()
              for pid in pids]
    if not wanted:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(wanted))) as pool:
        taken = pool.map(lambda item: probe.capture(
            dataclasses.replace(ranks[item[0]], pid=item[1]), False, fallback=False), wanted)
        out: dict[int, tuple[RankStacks, ...]] = {}
        for child in taken:
            if child.threads:
                out[child.rank] = out.get(child.rank, ()) + (child,)
        return out
