"""The collective wrapper as it was before issue 17 (commit 05e1991), kept verbatim so that
benchmarks/agent_overhead.py measures the cost before and after in the same run. Not used by
stalldoc itself."""
from __future__ import annotations

import functools

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
    # torch 2.13's names (all_gather_into_tensor / reduce_scatter_tensor now call these)
    "all_gather_single", "reduce_scatter_single", "all_reduce_coalesced", "all_gather_coalesced",
    "batch_isend_irecv", "send_object_list", "recv_object_list",
)
_PAYLOAD_PARAMS = ("tensor", "input_tensor", "input", "input_list", "input_tensor_list",
                   "tensor_list", "tensors", "obj", "object_list", "scatter_object_input_list")
_OBJECT_PARAMS = ("obj", "object_list", "scatter_object_input_list")
_ALWAYS_ASYNC = {"isend", "irecv", "batch_isend_irecv"}


class _Depth(threading.local):
    depth = 0


_local = _Depth()
_dtype_names: dict[Any, bytes] = {}
_world: list[Callable[[], Any]] = []
_NOTHING = (0, b"none")
_ASYNC = statefile.FLAG_ASYNC
_ABSENT = 10**6  # "this collective has no such parameter": no positional index reaches it


def _dtype_name(dtype: Any) -> bytes:
    name = _dtype_names.get(dtype)
    if name is None:
        name = str(dtype).replace("torch.", "").encode()[:8]
        _dtype_names[dtype] = name
    return name


def _payload(value: Any) -> tuple[int, bytes]:
    """(numel, dtype) of a tensor or a list of tensors."""
    try:
        dtype = value.dtype
    except AttributeError:
        pass
    else:
        return value.numel(), _dtype_names.get(dtype) or _dtype_name(dtype)
    if isinstance(value, (list, tuple)) and value:
        return sum(v.numel() for v in value), _dtype_name(value[0].dtype)
    return 0, b"none"


def _objects(value: Any) -> tuple[int, bytes]:
    """(count, "object") of a picklable object or a list of them."""
    return (len(value) if isinstance(value, (list, tuple)) else 1), b"object"


def _ring_of(agent: runtime.Agent, group: Any) -> statefile.GroupRing:
    """The ring of a group not seen before (None and the world group are one), cached by identity."""
    if group is None or (_world and group is _world[0]()):
        name = "world"
    else:
        name = str(getattr(group, "group_name", "") or f"pg{len(agent.groups)}")
    ring = agent.rings[id(group)] = agent.group_ring(name)
    return ring


def _recorder(op: str, fn: Callable[..., Any]) -> Callable[[Any, tuple, dict], tuple[Any, int]]:
    """A function that records one call of collective ``fn`` in its group's ring and returns
    (ring, offset of the entry). Where the payload, group and async flag sit is read once from
    ``fn``'s signature and bound as closure constants: this runs inside every collective."""
    params = list(inspect.signature(fn).parameters)
    name = op.encode()[:23]
    payload = next((p for p in _PAYLOAD_PARAMS if p in params), None)
    measure = _objects if payload in _OBJECT_PARAMS else _payload
    at_payload = params.index(payload) if payload else _ABSENT
    at_group = params.index("group") if "group" in params else _ABSENT
    at_async = params.index("async_op") if "async_op" in params else _ABSENT
    always_async = op in _ALWAYS_ASYNC
    clock = time.time

    def record(agent: Any, args: tuple, kwargs: dict) -> tuple[Any, int]:
        count = len(args)
        numel, dtype = (_NOTHING if payload is None else
                        measure(args[at_payload] if at_payload < count else kwargs.get(payload)))
        group = args[at_group] if at_group < count else kwargs.get("group")
        ring = agent.rings.get(id(group)) or _ring_of(agent, group)
        is_async = always_async or (args[at_async] if at_async < count
                                    else kwargs.get("async_op", False))
        entry = ring.enter(name, numel, dtype, _ASYNC if is_async else 0, clock())
        cuda = agent.cuda
        if cuda is not None:
            cuda.mark("collective", name, ring.started)
        return ring, entry

    return record


def wrap(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A drop-in replacement for collective ``fn`` that records it in the ring."""
    record = _recorder(op, fn)
    local = _local
    clock = time.time

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is None or not agent.enabled or local.depth:
            return fn(*args, **kwargs)
        try:
            ring, entry = record(agent, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - never into the job
            agent.fail(exc)
            return fn(*args, **kwargs)
        local.depth = 1
        try:
            return fn(*args, **kwargs)
        finally:
            local.depth = 0
            try:
                ring.exit(entry, clock())
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)

    # __module__, __qualname__, __wrapped__...: pickled by reference and inspected as the original
    functools.update_wrapper(wrapper, fn)
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
