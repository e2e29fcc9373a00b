"""How a user reads the stacks of every rank at once (py-spy's, or the stack dumps of PyTorch's
debug server): the processes whose main thread is not in a collective while the others are, are
the culprits, at their innermost own frame; all in collectives but not the same one is a
mismatch; a process whose stack could not be taken is gone."""
from __future__ import annotations

from dataclasses import dataclass

from harness import Diagnosis

COLLECTIVE = ("torch/distributed/", "deepspeed/comm/", "/gloo", "c10d")
LIBRARY = ("site-packages", "dist-packages", "/lib/python3", "<frozen")


@dataclass(frozen=True)
class Stack:
    """One process's main thread, innermost frame first: (function, file) pairs; ``idle`` as
    the tool showed it (None: the tool does not say)."""
    frames: tuple[tuple[str, str], ...]
    idle: bool | None = None


def read_stacks(t: float, stacks: dict[str, Stack | None], tool: str) -> list[Diagnosis]:
    gone = frozenset(part for part, stack in stacks.items() if stack is None)
    if gone:
        return [Diagnosis(t, gone, "", "dead_rank", f"{tool}: no stack of {sorted(gone)}")]
    taken = {part: stack for part, stack in stacks.items() if stack is not None}
    waiting = {part for part, stack in taken.items() if in_collective(stack)}
    outside = frozenset(taken) - waiting
    if waiting and outside:
        culprit = sorted(outside)[0]
        frame = own_frame(taken[culprit])
        return [Diagnosis(t, outside, frame, "rank_outside_collective",
                          f"{tool}: {sorted(waiting)} in a collective, {sorted(outside)} not "
                          f"({culprit} in {frame})")]
    ops = {part: op(stack) for part, stack in taken.items()}
    if waiting and len(set(ops.values())) > 1:
        return [Diagnosis(t, frozenset(), "", "collective_mismatch",
                          f"{tool}: ranks in different collectives {ops}")]
    return []


def in_collective(stack: Stack) -> bool:
    """In a collective's frames, or blocked in autograd's backward (DDP's gradient all-reduce
    runs there, below Python; a tool that does not say idle is read as blocked there)."""
    return any(any(m in filename for m in COLLECTIVE) for _, filename in stack.frames) or (
        stack.idle is not False and any("torch/autograd/" in filename
                                        for _, filename in stack.frames[:3]))


def own_frame(stack: Stack) -> str:
    own = next((name for name, filename in stack.frames
                if not any(m in filename for m in LIBRARY)), None)
    return own or (stack.frames[0][0] if stack.frames else "")


def op(stack: Stack) -> str:
    return next((name for name, filename in stack.frames if "distributed_c10d" in filename), "")
