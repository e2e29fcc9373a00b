"""SD539 out-of-memory."""
from __future__ import annotations

from typing import Any, Mapping

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind

_DEVICE = (r"\b(?:CUDA|HIP|NPU|XPU|MPS backend|cuda|hip) (?:error: )?out of memory",
           r"Cuda failure (?:\d+ )?'out of memory'",
           r"CUBLAS_STATUS_ALLOC_FAILED", r"\bcudaErrorMemoryAllocation", r"\bhipErrorOutOfMemory",
           r"RESOURCE_EXHAUSTED: Out of memory", r"\bCUDA_ERROR_OUT_OF_MEMORY\b")
_HOST = (r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
         r"\[Errno 12\] Cannot allocate memory",
         r"std::bad_alloc",
         r"(?:^|[\s:])MemoryError(?::|$)")
_KILLER = (r"\bOut of memory: Kill(?:ed)? process \d+",
           r"\boom-kill:",
           r"\bDetected \d+ oom[-_]kill events?",
           r"\binvoked oom-killer",
           r"\boom_reaper: reaped process \d+",
           r"\bexceeded memory limit \(\d+ > \d+\), being killed",
           r"\btasks? [\d,-]+: Out Of Memory$",
           r"\bWorkers \(tasks / actors\) killed due to memory pressure \(OOM\)",
           r"\bkilled due to the node running low on memory",
           r"\bray\.exceptions\.OutOfMemoryError")
_WORDINGS = {"device": _DEVICE, "host": _HOST, "host, the kernel's or Ray's OOM killer": _KILLER}


class OutOfMemory(LogKind):
    """Memory ran out, on the host or on a device, or an OOM killer ended a process.

    What it does
        Matches the kind in any program's words: a device's (``CUDA error: out of memory``,
        ``HIP out of memory``, ``NPU out of memory``, NCCL's ``Cuda failure 'out of memory'``,
        cuBLAS's ``CUBLAS_STATUS_ALLOC_FAILED``, XLA's ``RESOURCE_EXHAUSTED: Out of memory``);
        the host's (PyTorch's ``DefaultCPUAllocator: can't allocate memory``, ``[Errno 12]
        Cannot allocate memory``, ``std::bad_alloc``, Python's ``MemoryError``); an OOM killer's
        verdict (the kernel's ``Out of memory: Killed process N``, ``oom-kill:``, Ray's ``killed
        due to the node running low on memory``). SD506 keeps CUDA's ``Tried to allocate``
        message and SD532 Ray's memory monitor lines, with their own figures.

    Why is this bad?
        The process that could not allocate dies, or raises inside a rollout or a callback
        where the error is swallowed; its peers then wait for it in their next collective until
        the watchdog's timeout. An OOM killer's SIGKILL leaves no traceback at all: the rank is
        gone, and the launcher says only that it was killed.

    Evidence
        the lines; ``what`` (``device``, ``host``, or ``host, the kernel's or Ray's OOM
        killer``), the parts the lines carry (``pid``, ``rank``, ``local_rank``), the ranks
        that printed them.

    Fix
        On a device: lower the per-device batch size or the maximum lengths, raise
        tensor_parallel_size, lower vllm_gpu_memory_utilization where an engine shares the GPU,
        or offload. On the host: fewer DataLoader workers, a smaller prefetch, ZeRO offload
        only with host memory for it; `dmesg | grep -i oom` names what the kernel killed.

    References
        snakemake/snakemake-executor-plugin-slurm#371 (a Slurm job step that reads 12G into memory
        is OOM-killed by slurmstepd and retried); coqui-ai/STT#2238 (Coqui STT training in a
        Slurm/singularity job killed for exceeding the job memory limit); lanl/PyBNF#118 (a Slurm
        batch run killed by the cgroup OOM handler right after submitting its first batch of jobs);
        WM-PO/WMPO#3 (WMPO RL training on Ray: the raylet's memory monitor kills 2 workers for
        memory pressure (line wrapped by the terminal)); ShengcaiLiao/QAConv#19 (QAConv evaluation
        killed by the kernel OOM killer (dmesg) even with small test batch sizes); equinor/ert#7797
        (reproduction of an OOM kill of a realization process, read back from dmesg with ISO
        timestamps); Comfy-Org/Nvidia_RTX_Nodes_ComfyUI#13 (video upscaling node runs the host out
        of RAM (DefaultCPUAllocator)); nguyenvanhoang7398/FANG#1 (FANG training fails to allocate
        host memory (ENOMEM, error code 12)); PKU-YuanGroup/Open-Sora-Plan#386 (Open-Sora-Plan
        4-GPU training: NCCL cannot allocate device memory when enqueuing a collective, surfacing
        as 'NCCL Error 1: unhandled cuda error'); NVIDIA/TensorRT-LLM#1670 (TensorRT-LLM llama3
        served by Triton on 8xV100: NCCL repeatedly fails with CUDA out of memory on GPU 2);
        QwenLM/Qwen3#873 (Qwen quick-start on multiple GPUs fails to create a cuBLAS handle for
        lack of device memory; a single GPU with enough memory worked); tensorflow/models#9301 (TF
        2.3 multi-GPU MirroredStrategy example on 2x RTX 2080 Ti cannot create cuBLAS/cuDNN handles
        (allocation failure)); xingchensong/TouchNet#100 (TouchNet Qwen2-Audio ASR SFT under
        torchrun on 4 Ascend NPUs: NPU 3 runs out of device memory);
        flashserve/flash-linear-attention-npu#149 (verl on Ascend 910B: a corrupted sequence length
        (kernel writing out of bounds) makes the NPU allocator refuse a >1EB request);
        tensorflow/tensor2tensor#192 (tensor2tensor transformer training aborts with std::bad_alloc
        (host memory) during evaluation); real-stanford/flingbot#11 (flingbot simulation env actors
        on Ray are killed by Ray's memory monitor at 95% node memory).
    """

    code = "SD539"
    name = "out-of-memory"
    kind = "out_of_memory"
    severity = Severity.ERROR
    headline = "out of memory"
    wordings = _WORDINGS

    def fix_for(self, evidence: Mapping[str, Any]) -> str | None:
        if evidence.get("what") == "device":
            return ("Lower the per-device batch size or the maximum lengths, raise "
                    "tensor_parallel_size, lower vllm_gpu_memory_utilization where an engine "
                    "shares the GPU, or offload optimizer and parameters (ZeRO offload).")
        if evidence.get("what", "").startswith("host"):
            return ("Host memory ran out: fewer DataLoader workers or a smaller prefetch, no CPU "
                    "offload without the RAM for it, a larger memory limit for the container or "
                    "job; `dmesg | grep -i oom` names what the kernel killed.")
        return None
