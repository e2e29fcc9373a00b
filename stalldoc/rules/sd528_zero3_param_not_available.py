"""SD528 zero3-param-not-available."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class Zero3ParamNotAvailable(LogSignature):
    """A ZeRO-3 parameter was used while still partitioned on this rank.

    What it does
        Matches DeepSpeed's ``assert param.ds_status == ZeroParamStatus.AVAILABLE`` and the
        parameter summary it prints, ``'status': 'NOT_AVAILABLE'``.

    Why is this bad?
        Under ZeRO-3 a parameter exists whole only between its all-gather and its release. A
        module run outside the engine's hooks (a custom generate, a frozen sub-module, weights
        read for a vLLM sync) sees the empty shard: this rank raises while the others wait for it
        in the next all-gather, and the job hangs until the NCCL timeout.

    Evidence
        the lines, the ranks that printed them.

    Fix
        Run the code that uses the parameters inside ``deepspeed.zero.GatheredParameters`` (TRL:
        ds3_gather_for_generation true, the default); generate with vLLM (--use_vllm true) rather
        than the DeepSpeed-wrapped model; if it persists, train with --deepspeed zero2 (or
        zero3_offload only when memory forces it).

    References
        deepspeedai/DeepSpeed#4194 (RLHF generation under ZeRO-3), hiyouga/LlamaFactory#1121,
        QwenLM/Qwen-VL#103.
    """

    code = "SD528"
    name = "zero3-param-not-available"
    severity = Severity.ERROR
    headline = "ZeRO-3 parameter used while partitioned"
    patterns = (
        r"assert param\.ds_status == ZeroParamStatus\.AVAILABLE",
        r"'status': 'NOT_AVAILABLE'",
    )
