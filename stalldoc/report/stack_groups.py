"""The stacks of a stall, grouped: ranks whose main threads stand in the same frames are one
group (the waiting ranks as much as the culprit), each with what it waits on and its user frame.
Every report format shows stacks this way."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from stalldoc.analysis.stacks import user_frame
from stalldoc.detect.stack_kind import thread_wait
from stalldoc.model.stacks import Frame
from stalldoc.report.records import Report, StackRecord


@dataclass(frozen=True)
class StackGroup:
    """Ranks of one stall (on one node) whose main threads hold the same frames."""

    node: str
    stall_id: int | None
    ranks: tuple[int, ...]
    waits: str              # "collective", "socket", "blocked", ... ; "" when working
    frame: Frame | None     # the innermost frame of the user's own code
    frames: tuple[Frame, ...]   # the main thread's, innermost first
    method: str             # how the first rank's stacks were taken

    @property
    def state(self) -> str:
        return f"waiting: {self.waits}" if self.waits else "working"


def _key(stack: StackRecord) -> tuple[tuple[str, str, int], ...]:
    main = stack.main
    return tuple((f.function, f.filename, f.line) for f in main.frames) if main else ()


def _group(stacks: list[StackRecord]) -> StackGroup:
    first = stacks[0]
    main = first.main
    use_active = first.method != "faulthandler"
    return StackGroup(first.node, first.stall_id, tuple(sorted(s.rank for s in stacks)),
                      thread_wait(main, use_active) if main else "no python frames",
                      user_frame(main) if main and main.frames else None,
                      main.frames if main else (), first.method)


def stack_groups(report: Report) -> list[StackGroup]:
    """Per stall (and node), its ranks grouped by main-thread frames: working groups first (the
    likely culprits), then the largest; stalls in order."""
    by_stall: dict[tuple[str, int | None], dict[tuple, list[StackRecord]]] = defaultdict(
        lambda: defaultdict(list))
    for stack in report.stacks:
        if stack.threads:
            by_stall[(stack.node, stack.stall_id)][_key(stack)].append(stack)
    out: list[StackGroup] = []
    for _, groups in by_stall.items():
        made = [_group(g) for g in groups.values()]
        out += sorted(made, key=lambda g: (bool(g.waits), -len(g.ranks), g.ranks))
    return out
