"""SD403 async-generate-colocate."""
from __future__ import annotations

from typing import Iterator

from stalldoc.launch.clashes import version_tuple
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.launch import LaunchConfig
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule
from stalldoc.rules.config_helpers import visible_gpus


class AsyncGenerateColocate(Rule):
    """async_generate asked for with colocated vLLM.

    What it does
        Before launch, for a swift GRPO command: async_generate with vllm_mode colocate (or no
        vllm_mode, which swift 3.5-3.11 treat as colocate). Before 3.5 swift had no vllm_mode,
        and the layout depends on its version, read from the command's interpreter: 3.2.0 put
        vLLM on GPUs of its own (its "async mode", which async_generate is for: quiet); 3.2.1
        to 3.4 colocate only when num_infer_workers equals the GPUs the job sees (else quiet;
        quiet too when those GPUs are unknown). Versions not read: as 3.5.

    Why is this bad?
        Asynchronous generation needs a separate rollout server; colocated, the engine shares the
        rank with training and the rollout queue it waits on is never filled (swift 3.5+ refuses
        it, older versions deadlock).

    Evidence
        async_generate, vllm_mode.

    Fix
        Use vllm_mode server with a running ``swift rollout`` for async_generate, or turn
        async_generate off in colocate mode.

    References
        ms-swift GRPO docs (async_generate requires server mode); issue #3401; GRPO.md and
        rlhf_args.py ``_check_grpo`` at v3.2.2 to v3.4.1 (``is_colocate_mode = (device_count ==
        num_infer_workers)``); SD411 C01 for async mode's own hang with vLLM >= 0.8.
    """

    code = "SD403"
    name = "async-generate-colocate"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config = window.config
        if config is None or not config.is_grpo or not config.flag("async_generate"):
            return
        mode = config.value("vllm_mode")
        swift = window.resources.versions.get("ms-swift") if window.resources else None
        if mode is None and swift and version_tuple(swift) < (3, 5):
            mode = _before_vllm_mode(version_tuple(swift), config, visible_gpus(window))
        mode = mode or "colocate (default)"
        if mode.startswith("colocate"):
            yield self.finding((), f"async_generate with vllm_mode {mode}",
                               {"async_generate": True, "vllm_mode": mode, "ms_swift": swift})


def _before_vllm_mode(swift: tuple[int, ...], config: LaunchConfig, gpus: int | None) -> str:
    """Where swift before 3.5 puts vLLM: "colocate (...)" when training and rollout share the
    GPUs, else "dedicated ..." (its async mode), or "unknown ..." when the GPUs are."""
    said = ".".join(map(str, swift))
    if swift < (3, 2, 1):
        return f"dedicated (ms-swift {said} runs vLLM on GPUs of its own)"
    workers = config.value("num_infer_workers") or "1"
    if gpus is None or not workers.isdigit():
        return f"unknown (ms-swift {said}: the GPUs the job sees are not known)"
    if int(workers) == gpus:
        return (f"colocate (ms-swift {said}: num_infer_workers {workers} = the {gpus} GPUs the "
                "job sees)")
    return f"dedicated (ms-swift {said}: num_infer_workers {workers} of {gpus} GPUs)"
