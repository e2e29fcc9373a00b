"""The driver and the actors of a Ray job that are no rank: the part of the job that hands the
ranks their work. While any rank has work in hand the ranks decide a stall; once every rank
waits between tasks, it is this part's turn, and the job is stalled only when nothing here
works either.

Which process is the driver and which an actor is what Ray says inside it (its agent's
``ray-<pid>.json``). While every rank waits for its next task, each of these processes' stacks
is sampled off the tick (py-spy ``--nonblocking``, never a pause) every ``resample_every``
seconds and read for its kind: a process whose stack works has work in hand (a reward model
scoring, an engine generating); one that waits (``ray.get``, a socket, a lock, a rendezvous)
or idles in its task loop has none. A process busy in one unchanging stack for the busy
timeout is said to spin (SD121, a warning): it works, so it is never a stall."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Iterable

from stalldoc.agent.ray_facts import FILE_PREFIX
from stalldoc.detect.progress import resample_every
from stalldoc.detect.stack_kind import StackKind, classify, is_library
from stalldoc.model.ray_job import JobOutside, OutsideSeen, RayProcess
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks
from stalldoc.probes.connections import external_peers
from stalldoc.probes.pyspy import BackgroundStacks, StackProbe
from stalldoc.probes.ray_state import ray_processes, read_state


@dataclass
class _Process:
    process: RayProcess
    kind: StackKind | None = None
    stacks: RankStacks | None = None
    at: float = 0.0                  # when the latest sample was taken
    worked_at: float = 0.0           # the latest sample that worked
    busy_since: float | None = None  # working in one unchanging stack since
    signature: tuple = ()
    other: bool = False              # the last sample differed (one torn read of a spinning
                                     # stack is no move; two differing samples in a row are)


class RayJob:
    """The job's driver and its actors that are no rank, and whether they work."""

    def __init__(self, agent_dir: str | None, probe: StackProbe, floor: float) -> None:
        self.agent_dir = agent_dir
        self.probe = probe
        self.background = BackgroundStacks(probe, workers=2)
        self.every = resample_every(floor)
        # how long the turn outlasts a tick where not every rank was seen waiting (a rank's
        # stack read late on a loaded node); a rank that has work in hand decides anyway
        self.hold = max(2 * self.every, floor)
        self.known: dict[int, _Process] = {}
        self.turn_since: float | None = None   # every rank has waited between tasks since
        self.between_at = 0.0   # the last tick every rank waited (a rank's stack read late on
                                # a loaded node leaves it unknown for a tick or two)
        self.moved_at = 0.0                    # the latest tick something here worked

    def refresh(self, pids: Iterable[int], ranks: Iterable[int]) -> list[str]:
        """Learn the driver and the actors among the job's processes ``pids``; ``ranks`` (the
        ranks, and every process whose agent claims one) are the ranks' part, not this one.
        Returns what to say of the new ones."""
        if not self.agent_dir:
            return []
        found = ray_processes(self.agent_dir, (self._published() & set(pids)) - set(ranks))
        said = []
        for pid in [p for p in self.known if p not in found]:
            del self.known[pid]
        for pid, process in found.items():
            if pid not in self.known or self.known[pid].process != process:
                self.known[pid] = _Process(process)
                said.append(f"{process.label}: its ranks' work comes from it, it is no rank")
        return said

    def _published(self) -> set[int]:
        try:
            names = os.listdir(self.agent_dir or "")
        except OSError:
            return set()
        return {int(n[len(FILE_PREFIX):-5]) for n in names
                if n.startswith(FILE_PREFIX) and n.endswith(".json")
                and n[len(FILE_PREFIX):-5].isdigit()}

    def observe(self, now: float, between: bool) -> None:
        """One tick: ``between``, every live rank waits for its next task. Takes the samples
        finished since the last tick and asks for those due."""
        if between:
            self.between_at = now
            self.turn_since = now if self.turn_since is None else self.turn_since
        elif self.turn_since is not None and now - self.between_at > self.hold:
            self.turn_since = None   # a rank has had work in hand for a while: the ranks' turn
            for seen in self.known.values():
                seen.busy_since = None
        for stacks in self.background.done():
            if stacks.pid in self.known:
                self._seen(self.known[stacks.pid], stacks)
        if self.turn_since is not None:
            for seen in self.known.values():
                if now - seen.at >= self.every:
                    self.background.request(_as_rank(seen.process))

    def _seen(self, seen: _Process, stacks: RankStacks) -> None:
        kind = classify(stacks)
        if not kind.kind:
            return
        seen.kind, seen.stacks, seen.at = kind, stacks, stacks.t
        if kind.working:
            seen.worked_at = stacks.t
            self.moved_at = max(self.moved_at, stacks.t)
            signature = _spin_signature(kind)
            if not signature[1]:
                return   # a torn read (py-spy --nonblocking): no frames of the thread's own
            if seen.busy_since is None or (signature != seen.signature and seen.other):
                seen.busy_since, seen.signature = stacks.t, signature   # it moved on
                seen.other = False
            else:
                seen.other = signature != seen.signature
        else:
            seen.busy_since, seen.signature = None, ()

    def quiet_since(self, now: float) -> float | None:
        """Since when nothing of the job has worked, ranks and this part together (None: this
        part has work in hand, or has not been seen to have none). Every process here must have
        been read since the turn began, and lately."""
        if self.turn_since is None or not self.known:
            return None
        fresh = 2 * self.every + 2
        seen = list(self.known.values())
        if any(s.kind is None or s.at < self.turn_since or now - s.at > fresh for s in seen):
            return None
        if any(s.kind.working for s in seen if s.kind is not None):
            return None
        return max([self.turn_since] + [s.worked_at for s in seen])

    def spinning(self, now: float, busy_timeout: float) -> tuple[OutsideSeen, ...]:
        """The processes here busy in one unchanging stack for ``busy_timeout`` while every
        rank waits for its next task."""
        return tuple(self._outside(s, now) for s in self.known.values()
                     if self.turn_since is not None and s.busy_since is not None
                     and now - max(s.busy_since, self.turn_since) >= busy_timeout)

    def view(self, now: float, job_pids: Iterable[int]) -> JobOutside:
        """Where the job stands at a stall: fresh stacks of each process here, the servers
        outside the job they talk to (``job_pids``: the job's own processes), and Ray's state
        from the driver's dashboard."""
        for seen in self.known.values():
            self._seen(seen, self.probe.capture(_as_rank(seen.process), False, True, False))
        peers = external_peers([_as_rank(s.process) for s in self.known.values()], job_pids)
        dashboard = next((s.process.dashboard for s in self.known.values()
                          if s.process.dashboard), "")
        state = read_state(dashboard) if dashboard else None
        seen = tuple(dataclasses.replace(self._outside(s, now), peers=peers.get(-pid, ()))
                     for pid, s in self.known.items())
        return JobOutside(self.turn_since or now, seen, state)

    def _outside(self, seen: _Process, now: float) -> OutsideSeen:
        kind = seen.kind
        busy = now - seen.busy_since if seen.busy_since is not None else 0.0
        return OutsideSeen(seen.process, seen.stacks, kind.kind if kind else "",
                           _place(kind, seen.stacks), round(busy, 1))

    def close(self) -> None:
        self.background.close()


# frames of an expression inside a function (a generator expression, a comprehension, a
# lambda): a loop that spins in ``sum(x for x in values)`` is in that function all the time
_INNER = frozenset({"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>"})


def _spin_signature(kind: StackKind) -> tuple:
    """The deciding thread and its functions, an expression's own frames left out."""
    return kind.thread, tuple(f for f in kind.shape if f[0].rsplit(".", 1)[-1] not in _INNER)


def _place(kind: StackKind | None, stacks: RankStacks | None) -> Frame | None:
    """The deciding thread's innermost frame of the user's own code that is a function's
    (not an expression's inside it), else the kind's frame."""
    if kind is None or stacks is None:
        return kind.frame if kind is not None else None
    thread = next((t for t in stacks.threads if t.thread_id == kind.thread), None)
    own = [f for f in thread.frames if not is_library(f.filename)
           and f.name not in _INNER] if thread is not None else []
    return own[0] if own else kind.frame


def _as_rank(process: RayProcess) -> RankProcess:
    """The process as the probes take it (its rank minus its pid: it is none)."""
    return RankProcess(-process.pid, process.pid, None, (), from_env=False, source="")
