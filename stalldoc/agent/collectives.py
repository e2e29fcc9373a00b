"""Wrap torch.distributed collectives so every call lands in the rank's collective ring.

Installed by the post-import hook once the process itself imports ``torch.distributed``; this
module never imports torch. Each wrapped call costs two small writes into the mmap (enter and
exit); a collective called from inside another (``all_gather_object`` → ``all_gather``) is
recorded once, as the outer call.
"""
from __future__ import annotations

import inspect
import threading
import time
import types
from typing import Any, Callable

from stalldoc.agent import runtime, statefile

OPS = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "reduce", "barrier",
    "monitored_barrier", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
    "isend", "irecv", "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list",
)
_PAYLOAD_PARAMS = ("tensor", "input_tensor", "input", "input_list", "input_tensor_list",
                   "tensor_list", "obj", "object_list", "scatter_object_input_list")
_ALWAYS_ASYNC = {"isend", "irecv"}
_ENTRY = statefile.ENTRY
_F64 = __import__("struct").Struct("<d")
_COUNTERS = __import__("struct").Struct("<QQ")

_local = threading.local()
_dtype_names: dict[Any, bytes] = {}
_group_names: dict[int, str] = {}
_world: list[Any] = []


def _dtype_of(value: Any) -> bytes:
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return b"object"
    name = _dtype_names.get(dtype)
    if name is None:
        name = str(dtype).replace("torch.", "").encode()[:8]
        _dtype_names[dtype] = name
    return name


def _payload(value: Any) -> tuple[int, bytes]:
    """(numel, dtype) of a tensor, a list of tensors, or a list of objects."""
    if hasattr(value, "numel"):
        return int(value.numel()), _dtype_of(value)
    if isinstance(value, (list, tuple)):
        if value and all(hasattr(v, "numel") for v in value):
            return sum(int(v.numel()) for v in value), _dtype_of(value[0])
        return len(value), b"object"
    return 1, b"object"


def _group_name(group: Any) -> str:
    if group is None:
        return "world"
    if _world and group is _world[0]():
        return "world"
    name = _group_names.get(id(group))
    if name is None:
        name = str(getattr(group, "group_name", "") or f"pg{len(_group_names) + 1}")
        _group_names[id(group)] = name
    return name


def _argument(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    if index < len(args):
        return args[index]
    return kwargs.get(name, default)


class _Spec:
    """Where a collective keeps its payload, group and async flag, read once from its signature."""

    def __init__(self, op: str, fn: Callable[..., Any]) -> None:
        params = list(inspect.signature(fn).parameters)
        self.op = op.encode()[:23]
        payload = next((p for p in _PAYLOAD_PARAMS if p in params), None)
        self.payload = (params.index(payload), payload) if payload else None
        self.group = params.index("group") if "group" in params else 10**6
        self.async_index = params.index("async_op") if "async_op" in params else None
        self.always_async = op in _ALWAYS_ASYNC


def _enter(agent: runtime.Agent, spec: _Spec, args: tuple, kwargs: dict) -> tuple[int, int]:
    numel, dtype = (_payload(_argument(args, kwargs, *spec.payload, None))
                    if spec.payload else (0, b"none"))
    slot = agent.group_slot(_group_name(_argument(args, kwargs, spec.group, "group", None)))
    is_async = spec.always_async or (spec.async_index is not None and bool(
        _argument(args, kwargs, spec.async_index, "async_op", False)))
    counters = agent.coll_counters.setdefault(slot, [0, 0])
    counters[0] += 1
    seq = counters[0]
    buf = agent.state.buf
    _ENTRY.pack_into(buf, statefile.entry_offset(slot, seq), seq, numel, time.time(), 0.0,
                     spec.op, dtype, statefile.FLAG_ASYNC if is_async else 0)
    _COUNTERS.pack_into(buf, statefile.group_counter_offset(slot), seq, counters[1])
    return slot, seq


def _exit(agent: runtime.Agent, slot: int, seq: int) -> None:
    counters = agent.coll_counters[slot]
    counters[1] += 1
    buf = agent.state.buf
    _F64.pack_into(buf, statefile.entry_offset(slot, seq) + 24, time.time())
    _COUNTERS.pack_into(buf, statefile.group_counter_offset(slot), counters[0], counters[1])


def wrap(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A drop-in replacement for collective ``fn`` that records it in the ring."""
    spec = _Spec(op, fn)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is None or not agent.enabled or getattr(_local, "depth", 0):
            return fn(*args, **kwargs)
        try:
            slot, seq = _enter(agent, spec, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - never into the job
            agent.fail(exc)
            return fn(*args, **kwargs)
        _local.depth = 1
        try:
            return fn(*args, **kwargs)
        finally:
            _local.depth = 0
            if agent.enabled:
                try:
                    _exit(agent, slot, seq)
                except Exception as exc:  # noqa: BLE001
                    agent.fail(exc)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", op)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__stalldoc_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def install(dist: types.ModuleType) -> None:
    """Patch ``torch.distributed`` and its ``distributed_c10d`` module in place."""
    agent = runtime.current()
    if agent is None:
        return
    try:
        c10d = getattr(dist, "distributed_c10d", None)
        _world.append(lambda: getattr(getattr(dist, "GroupMember", None), "WORLD", None))
        for op in OPS:
            fn = getattr(dist, op, None)
            if fn is None or getattr(fn, "__stalldoc_wrapped__", False):
                continue
            wrapped = wrap(op, fn)
            setattr(dist, op, wrapped)
            if c10d is not None and getattr(c10d, op, None) is fn:
                setattr(c10d, op, wrapped)
    except Exception as exc:  # noqa: BLE001
        agent.fail(exc)
