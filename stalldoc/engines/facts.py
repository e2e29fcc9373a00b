"""The shape of an engine's facts. Plain frozen classes, not dataclasses: the agent reads
them in every process of the job, where the dataclass machinery (``inspect``) would cost more
to import than the facts themselves."""
from __future__ import annotations

from typing import Any


class _Frozen:
    """Fields set once, in ``__slots__``' order or by name, in ``__init__``; read-only after."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *values: Any, **fields: Any) -> None:
        if len(values) > len(self.__slots__):
            raise TypeError(f"{type(self).__name__}: {len(values)} values")
        fields.update(zip(self.__slots__, values))
        for name in self.__slots__:
            object.__setattr__(self, name, fields.pop(name))
        if fields:
            raise TypeError(f"{type(self).__name__}: no field {sorted(fields)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({inner})"


class WaitFrame(_Frozen):
    """A function of an engine's source where a thread waits for its engine's peers: py-spy
    shows the thread there while the collective's other ranks have not come.

    ``file``: the file's path tail as a regex, "/"-separated, ".py" last; ``names``: the
    functions (a method's own name), None for any in the file; ``why``: what the thread waits
    on, as a stack's kind says it."""

    __slots__ = ("file", "names", "why")
    file: str
    names: frozenset[str] | None
    why: str


class HookPoint(_Frozen):
    """A function of an engine's source the agent wraps once its module is imported.

    ``module``: the module's dotted name; ``qualname``: the function's qualified name in it;
    ``phase``: the phase a call on the main thread is (None: a progress marker only);
    ``action``: what else the wrapper records, by the agent's name for it (None: nothing;
    "sleep" / "wake": the engine's sleep state; "preempted": its scheduler's preemptions;
    "pynccl" / "group_create": a weight-sync channel's endpoint)."""

    __slots__ = ("module", "qualname", "phase", "action")
    module: str
    qualname: str
    phase: str | None
    action: str | None


class Engine(_Frozen):
    """One rollout engine as stalldoc recognises it.

    ``name``: as users write it ("vLLM"); ``package``: its top-level Python package; ``claim``:
    the claim of a process in a world the engine's own code created; ``worker``: what the
    engine calls a process of that world ("worker", "scheduler"); ``core``: what the process
    that started those is called; ``tp_collective``: the wait of its own TP / PP / DP / EP
    groups' coordinator; ``collective``: the wait of its device communicators and other peer
    groups; ``waits``: the frames of its source that are such waits; ``core_process``: the
    workers' parent is a process of the engine's own (vLLM's EngineCore), not the process that
    holds the engine (SGLang's schedulers are the children of the user's process);
    ``dp_sync``: the frames of its source where a data-parallel replica of the engine syncs
    with the others between or inside its steps (whether any has requests left, the batch
    sizes), outer frames of a collective: a replica waits there until every other replica
    comes, so the replicas must step together; ``hooks``: the functions the agent wraps in a
    process that imports the engine (its phases, progress and sleep state)."""

    __slots__ = ("name", "package", "claim", "worker", "core", "tp_collective", "collective",
                 "waits", "core_process", "dp_sync", "hooks")
    name: str
    package: str
    claim: str
    worker: str
    core: str
    tp_collective: str
    collective: str
    waits: tuple[WaitFrame, ...]
    core_process: bool
    dp_sync: tuple[WaitFrame, ...]
    hooks: tuple[HookPoint, ...]
