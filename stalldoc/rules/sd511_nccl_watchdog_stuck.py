"""SD511 nccl-watchdog-stuck."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class NcclWatchdogStuck(LogSignature):
    """ProcessGroupNCCL's watchdog itself stopped making progress (heartbeat monitor).

    What it does
        Matches ``ProcessGroupNCCL's watchdog got stuck for N seconds without making progress in
        monitoring enqueued collectives`` and ``Heartbeat monitor timed out! Process will be
        terminated after dumping debug info``.

    Why is this bad?
        The watchdog thread checks every collective; when it stops beating for
        TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s by default in recent torch) the monitor thread
        kills the process. The watchdog is usually blocked inside a CUDA or NCCL call (a
        ``cudaEventDestroy`` / ``cudaEventQuery`` behind a hung kernel, a driver problem) or by
        another thread holding the GIL inside a CUDA API. Seen at the end of training when
        ranks tear down their groups unevenly, and in data loaders that block the main thread.

    Evidence
        the lines, ``stuck_seconds`` and ``pending_works`` where printed, ``pg``, the global
        ranks that printed them.

    Fix
        Dump the stuck rank's threads (``py-spy dump --native --pid PID``; stalldoc's stall finding
        shows them): a thread in a CUDA call or holding the GIL is the cause. If the watchdog is
        only slow, raise TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC or set TORCH_NCCL_ENABLE_MONITORING=0.

        The watchdog is only slow during a huge checkpoint save or a long CPU phase at teardown.
        Call ``torch.distributed.destroy_process_group()`` on every rank at the end of training.

    References
        modelscope/ms-swift#7992 (stuck in teardown of the expert-parallel groups after
        training), hiyouga/LlamaFactory#6964 (ZeRO-3 offload of a 32B model), xdit-project/xDiT#147 (heartbeat monitor timed out at the end of the run),
        pytorch/pytorch#115888 (the message and its two settings).
        Lines of further projects: huggingface/transformers#30399 (Trainer.train() with Llama3
        hangs; torch's NCCL heartbeat monitor times out (glog-style line behind a '[3]:' launcher
        prefix; [PG 0 (default_pg) Rank 3] is the default group, so the global rank)).
    """

    code = "SD511"
    name = "nccl-watchdog-stuck"
    severity = Severity.CRITICAL
    headline = "NCCL watchdog stuck"
    patterns = (
        r"ProcessGroupNCCL's watchdog got stuck for (?P<stuck_seconds>\d+) ?seconds",
        r"Heartbeat monitor timed out! Process will be terminated after dumping debug info\."
        r"(?: workMetaList_\.size\(\)=(?P<pending_works>\d+))?",
    )
