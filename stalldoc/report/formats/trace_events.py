"""Chrome Trace Event Format building blocks (the JSON that ui.perfetto.dev, chrome://tracing
and Chrome DevTools' Performance panel open): events of each phase type, and the packing of
slices into lanes that nest.

Times are microseconds (``ts``, ``dur``). Complete slices ("X") on one thread must nest: a
slice that only partly overlaps another goes to a lane (thread) of its own. Flows are the
version 1 events ("s" / "t" / "f"): each carries the ``pid``, ``tid``, ``cat`` and ``ts`` of
the slice it binds to, the form all three consumers read (DevTools reads no other).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

Event = dict[str, Any]
MAX_LANES = 32          # lanes per kind of slice and process; slices beyond are left out


@dataclass(frozen=True)
class Slice:
    """A complete event to place: microseconds, a name, its category and arguments."""

    ts: float
    dur: float
    name: str
    cat: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.ts + self.dur


def complete(pid: int, tid: int, s: Slice) -> Event:
    return {"ph": "X", "pid": pid, "tid": tid, "ts": s.ts, "dur": s.dur, "name": s.name,
            "cat": s.cat, "args": s.args}


def instant(pid: int, tid: int, ts: float, name: str, cat: str, scope: str = "t",
            args: dict[str, Any] | None = None) -> Event:
    """An instant: scope "t" (its thread), "p" (its process) or "g" (the whole trace)."""
    return {"ph": "i", "pid": pid, "tid": tid, "ts": ts, "name": name, "cat": cat, "s": scope,
            "args": args or {}}


def counter(pid: int, ts: float, name: str, values: dict[str, float | int | None]) -> Event | None:
    """A counter sample (numbers only); None when it has no value."""
    numbers = {k: v for k, v in values.items() if isinstance(v, (int, float))}
    if not numbers:
        return None
    return {"ph": "C", "pid": pid, "tid": 0, "ts": ts, "name": name, "args": numbers}


def metadata(pid: int, tid: int, name: str, value: str | int) -> Event:
    """process_name / process_sort_index / thread_name / thread_sort_index."""
    key = "name" if name.endswith("_name") else "sort_index"
    return {"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": name, "args": {key: value}}


def flow(chain: Sequence[tuple[int, int, Slice]], flow_id: int, name: str) -> list[Event]:
    """Arrows linking the slices of ``chain`` (pid, tid, slice) in order: "s" on the first,
    "t" on the middle ones, "f" (bound to its enclosing slice) on the last."""
    events = []
    for i, (pid, tid, s) in enumerate(chain):
        ph = "s" if i == 0 else "f" if i == len(chain) - 1 else "t"
        event: Event = {"ph": ph, "pid": pid, "tid": tid, "ts": s.ts, "name": name,
                        "cat": s.cat, "id": flow_id}
        if ph == "f":
            event["bp"] = "e"
        events.append(event)
    return events


def lanes(slices: Iterable[Slice]) -> tuple[list[list[Slice]], int]:
    """The slices packed into lanes in each of which they nest (at most ``MAX_LANES``), and
    how many were left out."""
    packed: list[list[Slice]] = []
    stacks: list[list[Slice]] = []
    left_out = 0
    for s in sorted(slices, key=lambda s: (s.ts, -s.dur)):
        for lane, stack in zip(packed, stacks):
            while stack and stack[-1].end <= s.ts:
                stack.pop()
            if not stack or s.end <= stack[-1].end:
                lane.append(s)
                stack.append(s)
                break
        else:
            if len(packed) == MAX_LANES:
                left_out += 1
                continue
            packed.append([s])
            stacks.append([s])
    return packed, left_out
