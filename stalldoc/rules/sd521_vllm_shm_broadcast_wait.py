"""SD521 vllm-shm-broadcast-wait."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmShmBroadcastWait(LogSignature):
    """vLLM's engine waited a minute on a worker that does not read its message queue.

    What it does
        Matches ``No available shared memory broadcast block found in N seconds`` (and the older
        ``No available block found in N second``), printed by vLLM's shm_broadcast ring buffer.

    Why is this bad?
        The engine broadcasts each step to its tensor-parallel workers through shared memory; a
        full ring means at least one worker has not read for N seconds: it hangs (in a
        collective, after a sibling died) or is busy (compilation, weight loading). Repeated every
        minute after start-up, it is a hang; a bigger /dev/shm does not help.

    Evidence
        the lines, how often they came; the seconds waited per message.

    Fix
        Take the stacks of the VllmWorker processes (stalldoc's stack rules name the frame) and look
        for an earlier worker error; restart the engine once the cause is known. If it only shows
        during start-up compilation or loading, wait, or use --vllm_enforce_eager true.

        A bigger /dev/shm does not help; VLLM_RINGBUFFER_WARNING_INTERVAL changes only how often the
        message is printed.

    References
        vllm-project/vllm#25566 (the message rewritten to say "hanging"), vllm-project/vllm#51986,
        vllm-project/vllm-ascend#3717, eugr/spark-vllm-docker#348, gpustack/gpustack#3888
        (during a slow model load).
    """

    code = "SD521"
    name = "vllm-shm-broadcast-wait"
    severity = Severity.WARNING
    headline = "vLLM engine waiting on a worker (shm broadcast)"
    patterns = (
        r"No available (?:shared memory broadcast )?block found in (?P<waited_seconds>\d+) seconds?",
    )
