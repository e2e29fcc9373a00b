"""Wrap torch.distributed collectives so every call lands in the rank's collective ring.

Installed by the post-import hook once the process itself imports ``torch.distributed``; this
module never imports torch. Each wrapped call costs two small writes into the mmap (enter and
return); a collective called from inside another (``all_gather_object`` → ``all_gather``) is
recorded once, as the outer call.
"""
from __future__ import annotations

import functools

import inspect
import sys
import threading
import time
import types
import weakref
from typing import Any, Callable

from stalldoc.agent import identity, runtime, statefile

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
_dist: list[types.ModuleType] = []   # torch.distributed, once installed
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
    """The ring of a group not seen before (None and the world group are one), cached by identity.
    The first one also tells the agent its rank if ``init_process_group`` was not seen (a default
    group made by a module that bound torch's function before the agent wrapped it)."""
    if agent.claimed != statefile.SOURCE_GROUP and _dist:
        agent.claim(identity.from_group(_dist[0]))
    if group is None or (_world and group is _world[0]()):
        name = "world"
    else:
        name = str(getattr(group, "group_name", "") or f"pg{len(agent.groups)}")
    ring = agent.rings[id(group)] = agent.group_ring(name)
    return ring


def _remembered(agent: runtime.Agent, group: Any, ring: statefile.GroupRing) -> list[Any]:
    """What a wrapper keeps of its last call: agent, the group (None: the default group) as a
    weak reference, ring. Never the group itself: a process group held here would outlive the
    job's ``destroy_process_group()``, its gloo threads with it, into interpreter exit, where
    torch's exit race aborts the rank (SD115). A group that cannot be weakly referenced (a list
    of ranks, a name) is not remembered: looked up again next call."""
    if group is None:
        return [agent, None, ring]
    try:
        return [agent, weakref.ref(group), ring]
    except TypeError:
        return [None, None, None]


def _site(op: str, fn: Callable[..., Any]) -> tuple[str | None, Callable[..., tuple[int, bytes]],
                                                  int, int, int]:
    """Where ``fn`` takes its payload (name, measure, position), group and async flag: read once
    from its signature and bound into the wrapper as closure constants."""
    params = list(inspect.signature(fn).parameters)
    payload = next((p for p in _PAYLOAD_PARAMS if p in params), None)
    measure = _objects if payload in _OBJECT_PARAMS else _payload
    at = {name: params.index(name) if name in params else _ABSENT
          for name in (payload or "", "group", "async_op")}
    return payload, measure, at[payload or ""], at["group"], at["async_op"]


def wrap(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A drop-in replacement for collective ``fn`` that records it in its group's ring.

    The hot path is one frame: the entry is packed into the mmap straight from here (no
    ``GroupRing`` method calls, no tuples built), and a tensor's dtype name comes from a dict
    keyed by the dtype object."""
    payload, measure, at_payload, at_group, at_async = _site(op, fn)
    name = op.encode()[:23]
    flags = _ASYNC if op in _ALWAYS_ASYNC else 0
    local = _local
    clock = time.time
    pack_entry = statefile.ENTRY.pack_into
    pack_done = statefile.F64.pack_into
    mask, size = statefile.RING_MASK, statefile.ENTRY.size
    dtypes = _dtype_names
    tensor = payload is not None and measure is _payload
    last: list[Any] = [None, None, None]   # _remembered(): agent, weak group, ring

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is None or not agent.enabled or local.depth:
            return fn(*args, **kwargs)
        try:
            count = len(args)
            if not tensor:
                numel, dtype = (_NOTHING if payload is None else
                                measure(args[at_payload] if at_payload < count
                                        else kwargs.get(payload)))
            else:
                value = args[at_payload] if at_payload < count else kwargs.get(payload)
                try:
                    numel, dtype = value.numel(), dtypes[value.dtype]
                except (AttributeError, KeyError, TypeError):
                    numel, dtype = measure(value)
            group = (args[at_group] if at_group < count
                     else kwargs.get("group") if kwargs else None)
            weak = last[1]
            if agent is last[0] and (weak is None if group is None
                                     else weak is not None and weak() is group):
                ring = last[2]
            else:
                ring = agent.rings.get(id(group)) or _ring_of(agent, group)
                last[:] = _remembered(agent, group, ring)
            seq = ring.started = ring.started + 1
            offset = ring.base + ((seq - 1) & mask) * size
            pack_entry(ring.buf, offset, seq, numel, clock(), 0.0, name, dtype,
                       flags or (_ASYNC if (args[at_async] if at_async < count
                                            else kwargs.get("async_op") if kwargs else 0)
                                  else 0))
            if agent.cuda is not None:
                agent.cuda.mark("collective", name, seq)
        except Exception as exc:  # noqa: BLE001 - never into the job
            agent.fail(exc)
            return fn(*args, **kwargs)
        local.depth = 1
        try:
            return fn(*args, **kwargs)
        finally:
            local.depth = 0
            try:
                pack_done(ring.buf, offset + 24, clock())
            except Exception as exc:  # noqa: BLE001
                agent.fail(exc)

    # __module__, __qualname__, __wrapped__...: pickled by reference and inspected as the original
    functools.update_wrapper(wrapper, fn)
    wrapper.__stalldoc_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def wrap_teardown(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``destroy_process_group`` that tells the agent while it tears every group down (no
    group given, or the world): a crash in there is torch's teardown, not the training."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agent = runtime.current()
        group = args[0] if args else kwargs.get("group")
        whole = agent is not None and (group is None or (_world and group is _world[0]()))
        if whole:
            agent.guard(agent.teardown, True)
        done = False
        try:
            result = fn(*args, **kwargs)
            done = True
            return result
        finally:
            if whole:
                agent.guard(agent.teardown, False, done)

    functools.update_wrapper(wrapper, fn)
    wrapper.__stalldoc_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch(dist: types.ModuleType, c10d: Any, name: str, wrapped: Callable[..., Any],
           fn: Callable[..., Any]) -> None:
    setattr(dist, name, wrapped)
    if c10d is not None and getattr(c10d, name, None) is fn:
        setattr(c10d, name, wrapped)


def _wrap_init(dist: types.ModuleType) -> None:
    """``init_process_group`` wrapped wherever torch bound it (``torch.distributed``,
    ``distributed_c10d``, and modules such as ``device_mesh`` that imported the name before the
    agent was called: ``init_device_mesh`` creates the default group through it)."""
    init = getattr(dist, "init_process_group", None)
    if init is None or getattr(init, "__stalldoc_wrapped__", False):
        return
    wrapped = identity.wrap_init(dist, init, _publish)
    for name, module in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and getattr(
                module, "init_process_group", None) is init:
            setattr(module, "init_process_group", wrapped)


def _publish(claim: identity.Claim) -> None:
    agent = runtime.current()
    if agent is not None:
        agent.guard(agent.claim, claim)


def install(dist: types.ModuleType) -> None:
    """Patch ``torch.distributed`` and its ``distributed_c10d`` module in place."""
    agent = runtime.current()
    if agent is None:
        return
    try:
        c10d = getattr(dist, "distributed_c10d", None)
        _world.append(lambda: getattr(getattr(dist, "GroupMember", None), "WORLD", None))
        _dist.append(dist)
        _wrap_init(dist)
        for op in OPS:
            fn = getattr(dist, op, None)
            if fn is None or getattr(fn, "__stalldoc_wrapped__", False):
                continue
            _patch(dist, c10d, op, wrap(op, fn), fn)
        destroy = getattr(dist, "destroy_process_group", None)
        if destroy is not None and not getattr(destroy, "__stalldoc_wrapped__", False):
            _patch(dist, c10d, "destroy_process_group", wrap_teardown(destroy), destroy)
    except Exception as exc:  # noqa: BLE001
        agent.fail(exc)
