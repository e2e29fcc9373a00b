"""SD530 vllm-engine-preempting."""
from __future__ import annotations

from typing import Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule

FLOOR = 10   # preemptions within the recent window that make an engine one that thrashes


class VllmEnginePreempting(Rule):
    """A rank's vLLM engine keeps preempting requests: its KV cache is too small for the
    rollouts it is given.

    What it does
        Every tick, reads how many requests each rank's vLLM V1 engine preempted (its
        scheduler's ``_preempt_request``, counted by the agent in the engine core's process, or
        in the rank's own when the engine runs there: colocated, or without vLLM's
        multiprocessing) and reports a rank whose engines preempted at least 10 in the last
        minute. The finding holds while they do, and is resolved a minute after they stop.

    Why is this bad?
        A preempted request is thrown out of the KV cache and computed again from its prompt:
        with a cache too small for the group of completions a GRPO step asks for (many
        generations, long ``max_tokens``), the engine recomputes most of its work and rollouts
        slow down by multiples, looking like a hang. vLLM's V1 engine prints no line when it
        preempts (its V0 engine did: SD510), so the log says nothing; only its server's
        ``vllm:num_preemptions_total`` counts them.

    Evidence
        ``total`` preemptions of the rank's engines so far, ``recent`` in the last ``seconds``.

    Fix
        Give the engine a KV cache its rollouts fit in: raise --vllm_gpu_memory_utilization
        (in colocate mode, --offload_model true makes room), or ask for less at once: lower
        --vllm_max_num_seqs, --max_completion_length or --vllm_max_model_len; or spread the
        engine over more GPUs (--vllm_tensor_parallel_size).

        On vLLM's CPU backend the KV cache is VLLM_CPU_KVCACHE_SPACE (GiB), not
        gpu_memory_utilization.

    References
        vllm-project/vllm#18115 (V1 out of KV cache: "the generation speed dramatically
        breaks"), vllm-project/vllm#42827 (V1 logs nothing where it preempts; thrash seen only
        as latency, #25538); vLLM docs, Optimization: Preemption (its example warning is the V0
        engine's: V1 prints none); the community article "Swift GRPO training of a 32B model
        hangs" (Chinese, 2025: a hang with a low vLLM memory setting, preemption not named). Tested on vllm-cpu 0.32.0 with a
        KV cache of 4 blocks (``num_gpu_blocks_override``).
    """

    code = "SD530"
    name = "vllm-engine-preempting"
    severity = Severity.WARNING
    trigger = "tick"

    def check(self, window: Window) -> Iterator[Finding]:
        for rank, counted in sorted(window.preemptions.items()):
            if counted.recent < FLOOR:
                continue
            summary = (f"rank {rank}'s vLLM engine preempted {counted.recent} requests in the "
                       f"last {counted.seconds:.0f} s ({counted.total} so far): its KV cache is "
                       "full, and each preempted request is computed again from its prompt")
            yield self.finding((rank,), summary, {"total": counted.total,
                                                  "recent": counted.recent,
                                                  "seconds": counted.seconds})
