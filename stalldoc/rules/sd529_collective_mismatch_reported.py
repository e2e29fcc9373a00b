"""SD529 collective-mismatch-reported."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class CollectiveMismatchReported(LogSignature):
    """A backend or PyTorch's debug wrapper saw ranks call different collectives.

    What it does
        Matches the three places a mismatch is said out loud: PyTorch's collective checker
        (``TORCH_DISTRIBUTED_DEBUG=DETAIL``): ``Detected mismatch between collectives on ranks.
        Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=3104,
        OpType=ALLREDUCE, TensorShape=[...] ...), but Rank 0 is running collective: ...``;
        gloo's size check, which aborts the rank (``terminate called after throwing an instance
        of 'gloo::EnforceNotMet'``): ``[enforce fail at .../gloo/transport/tcp/pair.cc:456]
        op.preamble.length <= op.nbytes. 8 vs 1. Received data size doesn't match expected
        size. Is there a distributed collective mismatch in your code?``; and NCCL's
        ``Mismatched collective detected, please check your collective calls at and around
        rank 39``.

    Why is this bad?
        The ranks are not calling the same collective with the same tensors at the same point:
        a collective under a branch some ranks take, a different order, or tensors whose shape
        differs per rank (per-rank counts gathered without padding, an object list of another
        length). Under gloo the rank aborts (SIGABRT, SD103), under NCCL the job hangs or reads
        mixed data; the checker turns it into this error at the first such call.

    Evidence
        the lines; from the checker ``rank_a`` / ``op_a`` / ``shape_a`` against ``rank_b`` /
        ``op_b`` / ``shape_b``, ``seq`` and ``differ`` (what it says differs); from gloo the
        bytes ``received`` against those ``expected``; from NCCL the rank it names
        (``around_rank``); the global ranks that printed them.

    Fix
        Make every rank call the same collectives, in the same order, with tensors of the same
        shape: pad per-rank data to a common length (all_reduce the lengths with ReduceOp.MAX
        first) or use all_gather_object; move a collective out of a branch on the rank or on
        the data; give broadcast_object_list lists of one length on every rank.

        The op types and shapes in the line say which case it is; a stall finding of the same
        run (SD101 / SD102, with its cause) names the frames.

    References
        modelscope/ms-swift#9443 (ALLREDUCE of 195812480 against 51123456 elements),
        bghira/SimpleTuner#2712 (ALLGATHER on rank 1 against REDUCE on rank 7),
        sgl-project/sglang#37909 (gloo: an all_reduce of poll tensors of unequal length),
        pytorch/gloo#456 (gloo's size check before its message said "mismatch"),
        NVIDIA/nccl#296 (NCCL's own check).
        Lines of further projects: EchoseChen/SPA-VL-RLHF#2 (Reward-model RLHF training with
        TORCH_DISTRIBUTED_DEBUG: ranks 0 and 2 broadcast tensors of different shapes at the same
        sequence number ('0 :' is a launcher label)); deepspeedai/DeepSpeed#7568 (DeepSpeed fp16 +
        ZeRO + LR scheduler hang, rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL: rank 2 is in an
        ALLREDUCE (seq 32) while rank 3 is in a GATHER at seq 0); 2U1/Phi3-Vision-Finetune#41
        (Mixed text-only and image-text batches under DeepSpeed ZeRO-3: ranks all-gather different
        parameters at the same sequence number (works with ZeRO-2)).
    """

    code = "SD529"
    name = "collective-mismatch-reported"
    severity = Severity.ERROR
    headline = "collective mismatch reported"
    patterns = (
        r"Detected mismatch between collectives on ranks\. Rank (?P<rank_a>\d+) is running "
        r"collective: CollectiveFingerPrint\(SequenceNumber=(?P<seq>\d+),? ?OpType=(?P<op_a>\w+)"
        r"(?:, TensorShape=\[(?P<shape_a>[^\]]*)\])?.*?, but Rank (?P<rank_b>\d+) is running "
        r"collective: CollectiveFingerPrint\(SequenceNumber=\d+,? ?OpType=(?P<op_b>\w+)"
        r"(?:, TensorShape=\[(?P<shape_b>[^\]]*)\])?"
        r"(?:.*Collectives differ in the following aspects:\s*(?P<differ>[^\n]{0,120}))?",
        r"op\.preamble\.length <= op\.nbytes\. (?P<received>\d+) vs (?P<expected>\d+)",
        r"Mismatched collective detected, please check your collective calls at and around "
        r"rank (?P<around_rank>\d+)",
    )
