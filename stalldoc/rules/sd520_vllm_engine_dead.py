"""SD520 vllm-engine-dead."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmEngineDead(LogSignature):
    """vLLM's engine core process died.

    What it does
        Matches vLLM V1's ``EngineCore encountered a fatal error``, ``EngineDeadError``,
        ``Engine core proc EngineCore_N died unexpectedly`` and the input dump it writes when the
        engine crashes (``Dumping input data for V1 LLM engine``).

    Why is this bad?
        The engine does not come back. In colocate GRPO the rank that owns it waits forever at
        its next rollout while the other ranks wait for it in a collective; in server mode every
        request of the trainer fails or hangs until the server is restarted. (Some vLLM versions
        also print ``died unexpectedly`` when a finished script shuts the engine down,
        vllm-project/vllm#32468, #28838: at the very end of a completed run it is harmless, so
        an event made only of that line, printed in the last minute of a job that exits 0, is
        resolved at the exit.)

    Evidence
        the lines (the root cause is the EngineCore traceback printed just before them); the
        engine process named in ``died unexpectedly``.

    Fix
        Read the first exception of the EngineCore traceback above the line and restart the job
        (colocate) or ``swift rollout`` / ``trl vllm-serve`` (server mode).

        A CUDA OOM there: lower --vllm_gpu_memory_utilization, keep --sleep_level 1 with
        --offload_model true and --offload_optimizer true; ``RPC call to execute_model timed out``:
        see SD522; a crash in CUDA graph capture or replay: --vllm_enforce_eager true.

    References
        vllm-project/vllm#17276, vllm-project/vllm#19668 (fatal error after an RPC timeout),
        vllm-project/vllm#41647, vllm-project/vllm#29955, LMCache/LMCache#2306,
        gpustack/gpustack#2738, llm-d/llm-d-kv-cache#49, deepseek-ai/DeepSeek-OCR#110,
        modelscope/ms-swift#7933 (a swift rollout data-parallel engine died),
        vllm-project/vllm#32468 and vllm-project/vllm#28838 (the message at a normal shutdown).
    """

    code = "SD520"
    name = "vllm-engine-dead"
    severity = Severity.CRITICAL
    headline = "vLLM engine core died"
    patterns = (
        r"EngineCore encountered a fatal error",
        r"EngineDeadError",
        r"Engine core proc (?P<engine>\S+) died unexpectedly",
        r"Dumping input data for V1 LLM engine",
    )
    shutdown_patterns = (r"Engine core proc (?P<engine>\S+) died unexpectedly",)
