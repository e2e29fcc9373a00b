"""Phase markers in swift / TRL / HF Trainer / DeepSpeed / vLLM, with no change to their code.

Each hook names a module and a qualified name. Once the process imports that module itself
(``post_import.when_imported``: nothing is imported here), the function is wrapped in place: a
call on the main thread enters the phase and leaves it on return; a call on another thread, or a
hook without a phase (vLLM's engine step), only bumps the marker, which counts as progress. A
qualified name that does not resolve (another version of the library) switches that hook off; each
outcome is written to ``hooks-<pid>.txt`` in the agent directory. A phase already innermost is not
entered twice (an override calling its base). Channel hooks (``channels.py``: weight sync,
rollout and reward servers) give their phase a detail, the method and the remote endpoint; vLLM's
sleep / wake_up hooks also record the engine's sleep state.
"""
from __future__ import annotations

import functools
import os
import time

from stalldoc import engines
from stalldoc.agent import channels, post_import, primitives, runtime
from stalldoc.agent.statefile import (ENGINE_FIELDS, REQUESTS_RECORD,
                                      engine_settings_path, preempted_path, requests_path,
                                      served_path)

TYPE_CHECKING = False   # not typing's: the agent does not import typing (start-up cost)
if TYPE_CHECKING:
    import types
    from typing import Any, Callable


class Hook:
    """A function to wrap once ``module`` is imported (a plain class: no dataclass machinery in
    every process of the job)."""

    __slots__ = ("module", "qualname", "phase", "wrap")

    def __init__(self, module: str, qualname: str, phase: str | None,
                 wrap: Callable[[Callable[..., Any], str | None], Callable[..., Any]] | None
                 = None) -> None:
        self.module = module
        self.qualname = qualname
        self.phase = phase      # None: progress heartbeat only
        self.wrap = wrap        # None: ``marked``


def _swift(module: str) -> tuple[Hook, ...]:
    """The GRPO hook points of one swift layout (4.x: swift.rlhf_trainers)."""
    trainer, mixin = f"{module}.grpo_trainer", f"{module}.rollout_mixin"
    return (Hook(trainer, "GRPOTrainer.training_step", "step"),
            Hook(mixin, "RolloutTrainerMixin._generate_and_score_completions", "rollout"),
            Hook(mixin, "RolloutTrainerMixin._generate_completions", "generate"),
            Hook(trainer, "GRPOTrainer._score_completions", "reward"),
            Hook(trainer, "GRPOTrainer._compute_rewards_per_func", "reward"),
            Hook(mixin, "RolloutTrainerMixin._move_model_to_vllm", "weight_sync"),
            Hook(mixin, "RolloutTrainerMixin.offload_model", "offload_model"),
            Hook(mixin, "RolloutTrainerMixin.load_model", "load_model"),
            Hook(mixin, "RolloutTrainerMixin.offload_optimizer", "offload_optimizer"),
            Hook(mixin, "RolloutTrainerMixin.load_optimizer", "load_optimizer"),
            Hook(mixin, "RolloutTrainerMixin._wait_queue", "async_wait"))


def _sleep(waking: bool) -> Callable[[Callable[..., Any], str | None], Callable[..., Any]]:
    return lambda fn, phase: marked(channels.sleep_tracked(fn, waking), phase)


def _engines() -> tuple[Hook, ...]:
    """Each rollout engine's hook points (``stalldoc/engines``: vLLM's engines, the LLM entry
    point, its worker and engine core, PyNccl's weight broadcast and the weight-update group's
    rendezvous; SGLang's Engine and schedulers), each action bound to what records it."""
    actions = engine_actions()
    return tuple(Hook(p.module, p.qualname, p.phase, actions[p.action])
                 for engine in engines.ENGINES for p in engine.hooks)


def engine_actions() -> dict[str | None, Callable[[Callable[..., Any], str | None],
                                                  Callable[..., Any]] | None]:
    """What each action an engine's hook point names records, as the wrap of its hook."""
    return {None: None, "sleep": _sleep(False), "wake": _sleep(True), "preempted": preempted,
            "pynccl": channels.channel(channels.pynccl),
            "group_create": channels.channel(channels.group_create)}


WEIGHT_SYNC_METHODS = ("init_communicator", "update_named_param", "update_model_params",
                       "reset_prefix_cache", "close_communicator")
SWIFT_WEIGHT_SYNC_METHODS = (*WEIGHT_SYNC_METHODS, "update_flattened_params",
                             "update_adapter_flattened_param", "update_adapter_param",
                             "process_weights_after_loading")


def _trl_client(module: str) -> tuple[Hook, ...]:
    """TRL's VLLMClient (server mode): weight sync and generation on the ``trl vllm-serve``
    server."""
    wrap = channels.channel(channels.trl_server)
    return (*(Hook(module, f"VLLMClient.{m}", "weight_sync", wrap) for m in WEIGHT_SYNC_METHODS),
            *(Hook(module, f"VLLMClient.{m}", "rollout_server", wrap)
              for m in ("generate", "chat", "check_server")))


def _swift_client(module: str) -> tuple[Hook, ...]:
    """swift's rollout clients (``swift rollout`` server mode, GKD teacher servers)."""
    wrap = channels.channel(channels.swift_server)
    return (*(Hook(module, f"VLLMClient.{m}", "weight_sync", wrap)
              for m in SWIFT_WEIGHT_SYNC_METHODS),
            Hook(module, "VLLMInferClient.infer", "rollout_server", wrap),
            Hook(module, "VLLMInferClient.check_server", "rollout_server", wrap))


CHANNEL_HOOKS: tuple[Hook, ...] = (
    *_trl_client("trl.generation.vllm_client"),                  # TRL >= 0.24
    *_trl_client("trl.extras.vllm_client"),                      # older TRL
    *_swift_client("swift.rlhf_trainers.vllm_client"),           # ms-swift 4.x
    *_swift_client("swift.trainers.rlhf_trainer.vllm_client"),   # older ms-swift layout
    Hook("swift.infer_engine.infer_client", "InferClient.infer", "reward_server",
         channels.channel(channels.swift_infer_client)),        # a deployed reward model
)

def served(fn: Callable[..., Any], phase: str | None) -> Callable[..., Any]:
    """uvicorn's ``Server.main_loop`` wrapped to record, when the main thread serves HTTP (vLLM's
    OpenAI API server, ``trl vllm-serve``, ``swift rollout`` / ``deploy``), where it listens:
    ``served-<pid>.txt``. The process serves requests: its clients, not it, decide its work.
    ``main_loop`` runs once its start-up listens (``serve`` is entered seconds before: a client
    told then is refused)."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is not None and agent.enabled and primitives.get_ident() == _MAIN:
            agent.guard(_write_served, self, _listening(self), agent.directory)
            agent.tickers.append(RequestCounts(self, agent.directory).tick)
        return fn(self, *args, **kwargs)

    wrapper.__stalldoc_hook__ = True  # type: ignore[attr-defined]
    return wrapper


WRITE_EVERY = 1.0   # seconds between two writes of the preemption count
_PREEMPTED = [0, 0.0]   # requests preempted in this process, when the count was last written


def preempted(fn: Callable[..., Any], phase: str | None) -> Callable[..., Any]:
    """vLLM V1's ``Scheduler._preempt_request`` wrapped to count the requests its scheduler
    throws out of a full KV cache: ``preempted-<pid>.txt`` holds the count, written at most
    once a second (a thrashing engine preempts thousands of times)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _PREEMPTED[0] += 1
        agent = runtime._AGENT
        now = time.monotonic()
        if agent is not None and agent.enabled and now - _PREEMPTED[1] >= WRITE_EVERY:
            _PREEMPTED[1] = now
            agent.guard(_write_preempted, agent.directory, _PREEMPTED[0])
        return fn(*args, **kwargs)

    wrapper.__stalldoc_hook__ = True  # type: ignore[attr-defined]
    return wrapper


def _write_preempted(directory: str, count: int) -> None:
    """One line per write, the count so far (the last line is the count)."""
    with runtime.open_private(preempted_path(directory, os.getpid())) as fh:
        fh.write(f"{count}\n")


class RequestCounts:
    """The HTTP requests a uvicorn server holds now and has taken so far (its own
    ``server_state``: the tasks of requests in flight, ``total_requests``), written to
    ``requests-<pid>.txt`` when they change (one record, rewritten in place), read each
    heartbeat. Whether a request is in flight is what tells a server nobody asks from one that
    cannot answer. Reading them never raises: an unknown layout writes nothing."""

    __slots__ = ("server", "directory", "fd", "last")

    def __init__(self, server: Any, directory: str) -> None:
        self.server, self.directory, self.fd, self.last = server, directory, -1, None

    def tick(self, now: float) -> None:
        try:
            state = self.server.server_state
            counts = (len(state.tasks), int(state.total_requests))
        except Exception:  # noqa: BLE001 - another uvicorn: nothing to count, nothing written
            return
        if counts == self.last:
            return
        if self.fd < 0:
            self.fd = runtime.open_record(requests_path(self.directory, os.getpid()))
        os.pwrite(self.fd, REQUESTS_RECORD.format(*counts).encode(), 0)
        self.last = counts


def _listening(server: Any) -> list[Any]:
    """The sockets the server's start-up listens on (its asyncio servers'), if it says."""
    for listener in getattr(server, "servers", None) or ():
        sockets = getattr(listener, "sockets", None)
        if sockets:
            return list(sockets)
    return []


def _write_served(server: Any, sockets: Any, directory: str) -> None:
    """``http://host:port`` of the server's first TCP socket (or its config's), the wildcard
    address as the loopback one; nothing for a Unix socket or an unknown port."""
    config = getattr(server, "config", None)
    if sockets:
        name = sockets[0].getsockname()
        if not isinstance(name, tuple):
            return
        host, port = name[0], name[1]
    elif config is not None and not getattr(config, "uds", None) \
            and getattr(config, "fd", None) is None:
        host, port = getattr(config, "host", ""), getattr(config, "port", 0)
    else:
        return
    if not isinstance(port, int) or port <= 0:
        return
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    scheme = "https" if getattr(config, "ssl_keyfile", None) else "http"
    where = f"[{host}]" if ":" in host else host
    with runtime.open_private(served_path(directory, os.getpid())) as fh:
        fh.write(f"{scheme}://{where}:{port}\n")


HOOKS: tuple[Hook, ...] = (
    *_swift("swift.rlhf_trainers"),                       # ms-swift 4.x
    *_swift("swift.trainers.rlhf_trainer"),               # ms-swift 3.5-3.9
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer.training_step", "step"),
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer._generate_and_score_completions", "rollout"),
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer._calculate_rewards", "reward"),
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer._move_model_to_vllm", "weight_sync"),  # < 0.24
    Hook("trl.generation.vllm_generation", "VLLMGeneration.sync_weights", "weight_sync"),
    Hook("trl.generation.vllm_generation", "VLLMGeneration.generate", "generate"),
    Hook("transformers.trainer", "Trainer.training_step", "step"),
    Hook("transformers.trainer", "Trainer._save_checkpoint", "checkpoint_save"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.forward", "forward"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.backward", "backward"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.step", "optimizer_step"),
    *_engines(),
    Hook("uvicorn.server", "Server.main_loop", None, served),
    *CHANNEL_HOOKS,
)

_MAIN = primitives.get_ident()   # imported by the agent's start, on the main thread


def marked(fn: Callable[..., Any], phase: str | None) -> Callable[..., Any]:
    """``fn`` wrapped to mark ``phase`` (or only progress)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is None or not agent.enabled:
            return fn(*args, **kwargs)
        if phase is None or primitives.get_ident() != _MAIN or (
                agent.phases and agent.phases[-1][0] == phase):
            agent.guard(agent.progress)
            return fn(*args, **kwargs)
        agent.guard(agent.phase_enter, phase)
        try:
            return fn(*args, **kwargs)
        finally:
            agent.guard(agent.phase_exit, phase)

    wrapper.__stalldoc_hook__ = True  # type: ignore[attr-defined]
    return wrapper


def _install(hook: Hook, module: types.ModuleType) -> str:
    owner_name, _, attr = hook.qualname.rpartition(".")
    owner: Any = module
    for part in owner_name.split(".") if owner_name else ():
        owner = getattr(owner, part, None)
    fn = getattr(owner, attr, None) if owner is not None else None
    if fn is None or not callable(fn):
        return f"missing {hook.module}:{hook.qualname}"
    if getattr(fn, "__stalldoc_hook__", False):
        return f"already {hook.module}:{hook.qualname}"
    wrapped = _wrapped(hook, owner, attr, fn)
    if wrapped is None:
        return f"skipped {hook.module}:{hook.qualname} (not a plain method)"
    setattr(owner, attr, wrapped)
    return f"installed {hook.module}:{hook.qualname} -> {hook.phase or 'progress'}"


def _wrapped(hook: Hook, owner: Any, attr: str, fn: Callable[..., Any]) -> Any:
    """``fn`` wrapped as the class holds it (a plain or static method); None: another kind."""
    wrap = hook.wrap or marked
    if not isinstance(owner, type):
        return wrap(fn, hook.phase)
    import inspect
    import types
    static = inspect.getattr_static(owner, attr)
    if isinstance(static, staticmethod):
        return staticmethod(wrap(static.__func__, hook.phase))
    return wrap(fn, hook.phase) if isinstance(static, types.FunctionType) else None


ENGINE_ARGS = ("vllm.engine.arg_utils", "EngineArgs.create_engine_config")


def recorded_engine_args(fn: Callable[..., Any], directory: str) -> Callable[..., Any]:
    """``EngineArgs.create_engine_config`` wrapped to write the settings vLLM really gets to
    ``vllm-<pid>.json`` (appended, one line per engine)."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is not None and agent.enabled:
            agent.guard(_write_engine_args, self, directory)
        return fn(self, *args, **kwargs)

    wrapper.__stalldoc_hook__ = True  # type: ignore[attr-defined]
    return wrapper


def _write_engine_args(engine_args: Any, directory: str) -> None:
    import json
    values = {name: getattr(engine_args, name, None) for name in ENGINE_FIELDS}
    with runtime.open_private(engine_settings_path(directory, os.getpid())) as fh:
        fh.write(json.dumps(values, default=str) + "\n")


def _record(path: str, outcome: str) -> None:
    """One line per hook outcome in ``hooks-<pid>.txt``; a failed write is not the job's problem."""
    try:
        with runtime.open_private(path) as fh:
            fh.write(outcome + "\n")
    except OSError:
        pass


def install_all(agent: runtime.Agent) -> None:
    """Register every hook to be installed when its module is imported."""
    path = os.path.join(agent.directory, f"hooks-{agent.pid}.txt")

    def on_import(hook: Hook) -> Callable[[types.ModuleType], None]:
        def callback(module: types.ModuleType) -> None:
            _record(path, agent.guard(_install, hook, module) or f"failed {hook.qualname}")
        return callback

    for hook in HOOKS:
        post_import.when_imported(hook.module, on_import(hook))

    def engine_args(module: types.ModuleType) -> None:
        cls = getattr(module, "EngineArgs", None)
        fn = getattr(cls, "create_engine_config", None) if cls is not None else None
        outcome = f"missing {ENGINE_ARGS[0]}:{ENGINE_ARGS[1]}"
        if fn is not None and not getattr(fn, "__stalldoc_hook__", False):
            cls.create_engine_config = recorded_engine_args(fn, agent.directory)
            outcome = f"installed {ENGINE_ARGS[0]}:{ENGINE_ARGS[1]} -> engine settings"
        _record(path, outcome)

    post_import.when_imported(ENGINE_ARGS[0], lambda m: agent.guard(engine_args, m))
