"""SD523 vllm-worker-method-failed."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmWorkerMethodFailed(LogSignature):
    """A vLLM worker raised inside a method that all workers run together.

    What it does
        Matches ``Error executing method <m>. This might cause deadlock in distributed
        execution.`` (vLLM workers) and ``Invocation of collective_rpc method failed`` (V1 engine
        core, e.g. the weight-sync ``init_communicator`` of trl / swift server mode).

    Why is this bad?
        The other workers (or the trainer's weight-sync group) are already inside the collective
        and wait for the one that failed: vLLM says so itself, "might cause deadlock".

    Evidence
        the lines; the method that failed (its traceback follows the line).

    Fix
        Fix the error in the traceback after the line, then restart: the waiting workers do not
        recover. Out of memory in load_model / determine_num_available_blocks: lower
        --vllm_gpu_memory_utilization or --vllm_max_model_len, or raise --vllm_tensor_parallel_size.

        collective_rpc after ``/init_communicator/``: restart the vLLM server after a crashed
        trainer (it keeps the old group), use the same trl / swift and vLLM versions on both sides,
        and let the trainer reach the group port (NCCL_SOCKET_IFNAME).

    References
        vllm-project/vllm#4946 (load_model), vllm-project/vllm#10151, vllm-project/vllm#7046,
        huggingface/trl#3408 (collective_rpc after a client crash).
    """

    code = "SD523"
    name = "vllm-worker-method-failed"
    severity = Severity.ERROR
    headline = "vLLM worker method failed (others wait)"
    patterns = (
        r"Error executing method '?(?P<method>\w+)'?\. This might cause deadlock",
        r"Invocation of (?P<method>\w+) method failed",
    )
