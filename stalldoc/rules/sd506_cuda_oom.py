"""SD506 cuda-oom."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class CudaOom(LogSignature):
    """A CUDA out-of-memory error.

    What it does
        Matches ``CUDA out of memory. Tried to allocate X`` and ``torch.OutOfMemoryError``.

    Why is this bad?
        The rank dies, or (inside a rollout or a callback) the error is swallowed and its peers wait
        for it forever in the next collective.

    Evidence
        the lines, how much was requested, the ranks that printed them.

    Fix
        Lower vllm_gpu_memory_utilization, use sleep_level, move_model_batches, raise
        tensor_parallel_size, or reduce the per-device batch size / max lengths.

    References
        huggingface/trl#3172 (GRPO with LoRA and ZeRO-3 on 8xH100), huggingface/trl#2776;
        ms-swift GRPO docs; PyTorch CUDA memory management.
        Lines of further projects: carolchenyx/MGFN.#35 (MGFN training on a 6 GB GPU runs out of
        device memory); One-2-3-45/One-2-3-45#25 (One-2-3-45 mesh reconstruction on a 16 GB
        T4-class GPU fails with CUDA OOM (older allocator message format)); Li-Chongyi/Zero-DCE#52
        (Zero-DCE test run on a 6 GB GPU: CUDA OOM printed without the torch.cuda. prefix (notebook
        style)); kyuz0/amd-strix-halo-image-video-toolboxes#3 (ROCm PyTorch on an AMD Strix Halo
        APU runs out of GPU (HIP) memory); Tongyi-MAI/Z-Image#103 (Z-Image on a 24 GB AMD GPU: HIP
        out of memory); karpathy/nanoGPT#61 (nanoGPT training on an HPC cluster GPU runs out of
        device memory right after step 0, even at batch size 1); antgroup/echomimic_v2#115
        (EchoMimic v2 on a 16 GB GPU: CUDA OOM in the newer torch.OutOfMemoryError format).
    """

    code = "SD506"
    name = "cuda-oom"
    severity = Severity.ERROR
    headline = "CUDA out of memory"
    patterns = (
        r"(?:CUDA|HIP) out of memory\. Tried to allocate (?P<requested>[\d.]+ [KMG]i?B)",
        r"torch\.(cuda\.)?OutOfMemoryError",
    )
