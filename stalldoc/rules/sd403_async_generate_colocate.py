"""SD403 async-generate-colocate."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule


class AsyncGenerateColocate(Rule):
    """async_generate asked for with colocated vLLM.

    What it does
        Before launch, for a swift GRPO command: async_generate with vllm_mode colocate (or no
        vllm_mode, which swift 3.5-3.11 treat as colocate).

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
        ms-swift GRPO docs (async_generate requires server mode); issue #3401.
    """

    code = "SD403"
    name = "async-generate-colocate"
    severity = Severity.ERROR
    trigger = "launch"

    def check(self, window: Window) -> Iterator[Finding]:
        config = window.config
        if config is None or not config.is_grpo or not config.flag("async_generate"):
            return
        mode = config.value("vllm_mode") or "colocate (default)"
        if mode.startswith("colocate"):
            yield self.finding((), f"async_generate with vllm_mode {mode}",
                               {"async_generate": True, "vllm_mode": mode})
