"""SD502 device-mismatch."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class DeviceMismatch(LogSignature):
    """Tensors of one operation sit on two devices.

    What it does
        Matches ``Expected all tensors to be on the same device, but found at least two devices``.

    Why is this bad?
        The rank raises and dies, or (inside a rollout callback) the error is swallowed and the rank
        waits forever. In GRPO it comes from an offload / reload that left part of the model on the
        CPU or another GPU, or from a device_map that splits the model.

    Evidence
        the lines, the two devices (``device_a``, ``device_b``) and the operation (``op``, e.g.
        ``wrapper_CUDA_cat``) where torch names them, the ranks that printed them.

    Fix
        Check the offload and reload of the model (offload_model, offload_optimizer) and device_map;
        upgrade vLLM (>= 0.7.2) and set the vLLM device explicitly.

    References
        huggingface/trl#3008 (torch.cat of prompt and completion ids on cuda:0 and cuda:1 with vLLM
        on a second GPU), vllm-project/vllm#2108 (a vLLM model and a second model on another GPU),
        huggingface/trl#2851 (GRPOTrainer with vLLM, two GPUs); the community article "Swift GRPO
        training of a 32B model hangs" (Chinese, 2025); ms-swift GRPO docs.
    """

    code = "SD502"
    name = "device-mismatch"
    severity = Severity.ERROR
    headline = "device mismatch"
    patterns = (
        r"Expected all tensors to be on the same device, but found at least two devices, "
        r"(?P<device_a>[\w:]+) and (?P<device_b>[\w:]+)!(?: \(when checking argument for argument "
        r"\w+ in method (?P<op>\w+)\))?",
        r"Expected all tensors to be on the same device, but found at least two devices",
    )
