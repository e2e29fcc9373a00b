"""Why a rank is missing from the collective the others wait in, where the evidence decides it.

A stall finding says who is missing; a cause says why, with a fix written for that cause. Each
cause is decided from evidence already collected (here: the ranks' PyTorch Flight Recorder
dumps, taken on the stall) and is None when that evidence is missing or does not decide it: the
finding then says what is known and no more.

- ``uneven_steps``: the missing rank is not stuck in its own code; it waits in a collective too,
  one DDP issued from ``backward()`` (the gradient all-reduce), at the very sequence number where
  the waiting ranks sit in another collective (a barrier, an all-reduce of metrics after the
  loop). The ranks ran different numbers of steps: uneven inputs.
- ``collective_order``: the same, but neither side's collective comes from ``backward()``: the
  ranks call different collectives at the same point (one called on some ranks only, or in a
  different order).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from stalldoc.analysis.flight_recorder import op_name
from stalldoc.analysis.stacks import is_library
from stalldoc.model.collectives import FlightDump, FlightEntry
from stalldoc.model.stacks import RankStacks

UNEVEN_STEPS_FIX = (
    "Give every rank the same number of batches: a DistributedSampler with drop_last=True "
    "(`--dataloader_drop_last true` for the HF Trainer, TRL and swift), or trim the data to a "
    "multiple of the world size before sharding it; where ranks must run out of data at "
    "different times, wrap the loop in `with model.join():` (DDP) or "
    "`torch.distributed.algorithms.Join`, which shadows the missing collectives of the ranks "
    "that are done.")
COLLECTIVE_ORDER_FIX = (
    "Make every rank call the same collectives in the same order: a collective under a branch "
    "on the rank (`if rank == 0:`) or on the data must be called by every rank, or moved out of "
    "the branch; compare the two frames named.")
_BACKWARD_FUNCTIONS = {"_engine_run_backward", "run_backward"}


@dataclass(frozen=True)
class Cause:
    """A cause of a stall finding: its kind, the sentence the finding adds, its fix, its facts."""

    kind: str
    says: str
    fix: str
    facts: Mapping[str, Any]

    def evidence(self) -> dict[str, Any]:
        """The finding's ``evidence.cause``."""
        return {"kind": self.kind, "says": self.says, **self.facts}


def missing_rank_cause(flight: Mapping[int, FlightDump], stacks: Mapping[int, RankStacks],
                       culprits: Iterable[int], waiting: Iterable[int]) -> Cause | None:
    """The cause of ``culprits`` missing from the collective ``waiting`` sit in, from their
    Flight Recorder dumps: a culprit pending in another collective at a sequence number a
    waiting rank is pending at (None when no dump shows one). A dump without frames (torch
    records them only in some set-ups) is completed by the rank's stack: a main thread inside
    autograd's backward issued its pending collective from there."""
    waiting = sorted(waiting)
    for culprit in sorted(culprits):
        mine = _pending(flight.get(culprit), stacks.get(culprit))
        for other in waiting:
            for key, theirs in _pending(flight.get(other), stacks.get(other)).items():
                entry = mine.get(key)
                if entry is not None and _differ(entry, theirs):
                    return _cause(culprit, entry, other, theirs)
    return None


def _differ(entry: FlightEntry, theirs: FlightEntry) -> bool:
    """Whether two ranks' collectives at one sequence number are different calls."""
    return ((op_name(entry), entry.input_sizes, from_backward(entry))
            != (op_name(theirs), theirs.input_sizes, from_backward(theirs)))


def _pending(dump: FlightDump | None, stacks: RankStacks | None
             ) -> dict[tuple[str, int], FlightEntry]:
    """(group, seq) -> the pending collective there, of one rank's dump (frames from the
    rank's main thread where the dump has none and that thread is in a backward pass)."""
    if dump is None:
        return {}
    main = stacks.main if stacks is not None else None
    backward = main.frames if main is not None and any(
        f.function in _BACKWARD_FUNCTIONS for f in main.frames) else ()
    return {(e.group, e.seq): e if e.frames else replace(e, frames=backward)
            for e in dump.entries if e.pending and not e.p2p and e.seq > 0}


def _cause(culprit: int, entry: FlightEntry, other: int, theirs: FlightEntry) -> Cause:
    facts = {"source": "flight_recorder", "group": entry.group, "seq": entry.seq,
             "ops": {str(culprit): op_name(entry), str(other): op_name(theirs)},
             "frames": {str(culprit): issued_at(entry), str(other): issued_at(theirs)}}
    group = "world" if entry.group_desc == "default_pg" else entry.group_desc or entry.group
    where = f"#{entry.seq} of group {group} in the Flight Recorder"
    if from_backward(entry) and not from_backward(theirs):
        says = (f"rank {culprit} waits in DDP's gradient {op_name(entry)} ({where}), issued by "
                f"backward() at {issued_at(entry) or 'an unknown frame'}, where rank {other} is "
                f"in {op_name(theirs)}{_at(theirs)}: the ranks ran different numbers of steps "
                "(uneven inputs)")
        return Cause("uneven_steps", says, UNEVEN_STEPS_FIX, facts)
    says = (f"rank {culprit} is in {op_name(entry)}{_at(entry)} and rank {other} in "
            f"{op_name(theirs)}{_at(theirs)}, both {where}: the ranks call different collectives "
            "at the same point (one called on some ranks only, or in a different order)")
    return Cause("collective_order", says, COLLECTIVE_ORDER_FIX, facts)


def from_backward(entry: FlightEntry) -> bool:
    """Whether the collective was issued inside autograd's backward pass (DDP's reducer)."""
    return any(f.function in _BACKWARD_FUNCTIONS for f in entry.frames)


def issued_at(entry: FlightEntry) -> str:
    """The innermost frame outside libraries where the collective was issued ('' if none)."""
    frame = next((f for f in entry.frames if not is_library(f.filename)), None)
    return str(frame) if frame else ""


def _at(entry: FlightEntry) -> str:
    where = issued_at(entry)
    return f" at {where}" if where else ""
