"""Phase markers in swift / TRL / HF Trainer / DeepSpeed / vLLM, with no change to their code.

Each hook names a module and a qualified name. Once the process imports that module itself
(``post_import.when_imported``: nothing is imported here), the function is wrapped in place: a
call on the main thread enters the phase and leaves it on return; a call on another thread, or a
hook without a phase (vLLM's engine step), only bumps the marker, which counts as progress. A
qualified name that does not resolve (another version of the library) switches that hook off; each
outcome is written to ``hooks-<pid>.txt`` in the agent directory. A phase already innermost is not
entered twice (an override calling its base).
"""
from __future__ import annotations

import _thread
import functools
import os

from stalldoc.agent import post_import, runtime

TYPE_CHECKING = False   # not typing's: the agent does not import typing (start-up cost)
if TYPE_CHECKING:
    import types
    from typing import Any, Callable


class Hook:
    """A function to wrap once ``module`` is imported (a plain class: no dataclass machinery in
    every process of the job)."""

    __slots__ = ("module", "qualname", "phase")

    def __init__(self, module: str, qualname: str, phase: str | None) -> None:
        self.module = module
        self.qualname = qualname
        self.phase = phase      # None: progress heartbeat only


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


HOOKS: tuple[Hook, ...] = (
    *_swift("swift.rlhf_trainers"),                       # ms-swift 4.x
    *_swift("swift.trainers.rlhf_trainer"),               # ms-swift 3.5-3.9
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer.training_step", "step"),
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer._generate_and_score_completions", "rollout"),
    Hook("trl.trainer.grpo_trainer", "GRPOTrainer._calculate_rewards", "reward"),
    Hook("transformers.trainer", "Trainer.training_step", "step"),
    Hook("transformers.trainer", "Trainer._save_checkpoint", "checkpoint_save"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.forward", "forward"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.backward", "backward"),
    Hook("deepspeed.runtime.engine", "DeepSpeedEngine.step", "optimizer_step"),
    Hook("vllm.engine.llm_engine", "LLMEngine.step", None),
    Hook("vllm.engine.llm_engine", "LLMEngine.sleep", "vllm_sleep"),
    Hook("vllm.engine.llm_engine", "LLMEngine.wake_up", "vllm_wake_up"),
    Hook("vllm.v1.engine.llm_engine", "LLMEngine.step", None),
    Hook("vllm.v1.engine.llm_engine", "LLMEngine.sleep", "vllm_sleep"),
    Hook("vllm.v1.engine.llm_engine", "LLMEngine.wake_up", "vllm_wake_up"),
)

_MAIN = _thread.get_ident()   # imported by the agent's start, on the main thread


def marked(fn: Callable[..., Any], phase: str | None) -> Callable[..., Any]:
    """``fn`` wrapped to mark ``phase`` (or only progress)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agent = runtime._AGENT
        if agent is None or not agent.enabled:
            return fn(*args, **kwargs)
        if phase is None or _thread.get_ident() != _MAIN or (
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
    import inspect
    import types
    if isinstance(owner, type) and not isinstance(inspect.getattr_static(owner, attr),
                                                  types.FunctionType):
        return f"skipped {hook.module}:{hook.qualname} (not a plain method)"
    if getattr(fn, "__stalldoc_hook__", False):
        return f"already {hook.module}:{hook.qualname}"
    setattr(owner, attr, marked(fn, hook.phase))
    return f"installed {hook.module}:{hook.qualname} -> {hook.phase or 'progress'}"


ENGINE_FIELDS = ("gpu_memory_utilization", "max_model_len", "tensor_parallel_size",
                 "enable_sleep_mode", "max_num_seqs", "enable_prefix_caching")
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
    with runtime.open_private(os.path.join(directory, f"vllm-{os.getpid()}.json")) as fh:
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
