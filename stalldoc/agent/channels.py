"""Weight-sync, rollout and reward channels, and vLLM's sleep state, as the agent marks them.

A channel call (TRL's / swift's vLLM client, vLLM's PyNccl weight broadcast, a reward model
client) is a phase with a detail: ``method<TAB>mode<TAB>endpoint``, the endpoint read from the
client object or the call's arguments (``host:port``, credentials in a URL dropped). A call on
another thread only counts as progress. vLLM engines' ``sleep`` / ``wake_up`` calls that return
are recorded per engine (asleep since, level, woken tags) in the state file. Standard library
only, and nothing imported: this runs inside the job.
"""
from __future__ import annotations

import functools
import time

from stalldoc.agent import primitives, runtime, statefile

TYPE_CHECKING = False   # not typing's: the agent does not import typing (start-up cost)
if TYPE_CHECKING:
    from typing import Any, Callable

    Describe = Callable[[str, tuple, dict], str]
    Wrap = Callable[[Callable[..., Any], "str | None"], Callable[..., Any]]

_MAIN = primitives.get_ident()   # imported with the hooks by the agent's start, on the main thread
_TAGS = {"weights": statefile.TAG_WEIGHTS, "kv_cache": statefile.TAG_KV_CACHE}
_ALL_TAGS = statefile.TAG_WEIGHTS | statefile.TAG_KV_CACHE


def netloc(url: object) -> str:
    """``host:port`` of a URL, without any ``user:password@``."""
    text = str(url)
    rest = text.partition("://")[2] or text
    return rest.partition("/")[0].rpartition("@")[2]


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return kwargs.get(name, args[index] if len(args) > index else None)


# ----- details: (method name, positional args with self, keyword args) -> text ---------------
def trl_server(method: str, args: tuple, kwargs: dict) -> str:
    """TRL's VLLMClient: its ``base_url``; the weight-update group's port where it has one."""
    client = args[0]
    group = f" (group port {client.group_port})" if method == "init_communicator" else ""
    return f"{method}\tserver\t{netloc(getattr(client, 'base_url', '?'))}{group}"


def swift_server(method: str, args: tuple, kwargs: dict) -> str:
    """swift's VLLMClient / VLLMInferClient: every server of ``base_urls``."""
    client = args[0]
    servers = ", ".join(netloc(u) for u in getattr(client, "base_urls", ()) or ("?",))
    ports = getattr(client, "group_ports", None)
    group = f" (group ports {', '.join(map(str, ports))})" if (
        ports and method == "init_communicator") else ""
    return f"{method}\tserver\t{servers}{group}"


def swift_infer_client(method: str, args: tuple, kwargs: dict) -> str:
    """swift's InferClient (a deployed reward / judge model): its ``base_url``."""
    return f"{method}\tserver\t{netloc(getattr(args[0], 'base_url', '?'))}"


def group_create(method: str, args: tuple, kwargs: dict) -> str:
    """vLLM's ``StatelessProcessGroup.create(host, port, rank, world_size)``."""
    host, port = _arg(args, kwargs, 0, "host"), _arg(args, kwargs, 1, "port")
    rank, world = _arg(args, kwargs, 2, "rank"), _arg(args, kwargs, 3, "world_size")
    return f"StatelessProcessGroup.create\tgroup\t{host}:{port} (rank {rank} of {world})"


def _group_endpoint(group: Any) -> str:
    store = getattr(group, "store", None)
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    where = f"{host}:{port}" if host else "its TCPStore"
    return f"{where} (rank {getattr(group, 'rank', '?')} of {getattr(group, 'world_size', '?')})"


def pynccl(method: str, args: tuple, kwargs: dict) -> str:
    """vLLM's PyNcclCommunicator: the rendezvous of its StatelessProcessGroup."""
    group = _arg(args, kwargs, 1, "group") if method == "__init__" else getattr(
        args[0], "group", None)
    return f"PyNcclCommunicator.{method.strip('_') or method}\tgroup\t{_group_endpoint(group)}"


# ----- wrappers ------------------------------------------------------------------------------
def channel(describe: Describe) -> Wrap:
    """A hook's wrapper factory: the call is phase ``phase`` with ``describe``'s detail."""
    def factory(fn: Callable[..., Any], phase: str | None) -> Callable[..., Any]:
        name = fn.__name__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            agent = runtime._AGENT
            if agent is None or not agent.enabled or phase is None:
                return fn(*args, **kwargs)
            if primitives.get_ident() != _MAIN:
                agent.guard(agent.progress)
                return fn(*args, **kwargs)
            detail = _described(describe, name, args, kwargs)
            old = agent.guard(agent.channel_enter, phase, detail)
            try:
                return fn(*args, **kwargs)
            finally:
                agent.guard(agent.channel_exit, phase, old)

        wrapper.__stalldoc_hook__ = True  # type: ignore[attr-defined]
        return wrapper
    return factory


def _described(describe: Describe, name: str, args: tuple, kwargs: dict) -> str:
    """The call's detail; the bare method name when the client object is not as expected (an
    attribute another library version lacks costs the detail, never the agent)."""
    try:
        return describe(name, args, kwargs) or name
    except Exception:  # noqa: BLE001
        return name


_ENGINES: dict[int, list] = {}   # engine key -> [slot, sleeps, wakes, state, level, tags,
                                 #                 asleep_at, woken_at]
_BUSY: set[int] = set()          # engines in a recorded call (LLM.sleep calls LLMEngine.sleep)


def sleep_tracked(fn: Callable[..., Any], waking: bool) -> Callable[..., Any]:
    """``sleep`` / ``wake_up`` of a vLLM LLM or engine: once it returns, its engine's state."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        key = id(getattr(self, "llm_engine", self))
        if agent is None or not agent.enabled or key in _BUSY:
            return fn(self, *args, **kwargs)
        _BUSY.add(key)
        started = time.time()
        try:
            result = fn(self, *args, **kwargs)
        finally:
            _BUSY.discard(key)
        agent.guard(_record, agent, key, waking, started, args, kwargs)
        return result

    wrapper.__stalldoc_hook__ = True  # type: ignore[attr-defined]
    return wrapper


def _tag_mask(tags: Any) -> int:
    if tags is None:
        return _ALL_TAGS
    return sum({_TAGS.get(str(t), 0) for t in tags})


def _record(agent: runtime.Agent, key: int, waking: bool, started: float, args: tuple,
            kwargs: dict) -> None:
    engine = _ENGINES.get(key)
    if engine is None:
        if len(_ENGINES) >= statefile.ENGINE_SLOTS:
            return   # the first engines of the process are tracked
        engine = _ENGINES[key] = [len(_ENGINES), 0, 0, statefile.ENGINE_AWAKE, 0, 0, 0.0, 0.0]
    if waking:
        if engine[3] != statefile.ENGINE_AWAKE:
            engine[5] |= _tag_mask(_arg(args, kwargs, 0, "tags"))
            engine[3] = (statefile.ENGINE_AWAKE if engine[5] == _ALL_TAGS
                         else statefile.ENGINE_PARTLY_AWAKE)
        engine[2] += 1
        engine[7] = time.time()
    else:
        engine[1] += 1
        engine[3:7] = [statefile.ENGINE_ASLEEP, int(_arg(args, kwargs, 0, "level") or 1), 0,
                       started]
    agent.state.engine(engine[0], key & 0xFFFFFFFFFFFFFFFF, *engine[1:])
