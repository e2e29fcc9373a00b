"""SD519 flight-recorder-off."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class FlightRecorderOff(LogSignature):
    """A collective failed and PyTorch's Flight Recorder was off, so it kept no record of it.

    What it does
        Matches ``Stack trace of the failed collective not found, potentially because
        FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a
        non-zero value.``, printed by the watchdog next to a timeout or an NCCL error.

    Why is this bad?
        It is a hint, not a cause (the cause is SD501 / SD513 / SD517 printed with it): without
        the Flight Recorder the next hang leaves no per-rank record of which collective each rank
        had issued, with its size and the Python stack that called it, which is what tells a
        rank on another code path from a slow network.

    Evidence
        the lines, the global ranks that printed them.

    Fix
        Turn the Flight Recorder on for the next run: ``TORCH_FR_BUFFER_SIZE=2000`` (older torch:
        ``TORCH_NCCL_TRACE_BUFFER_SIZE``), ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and a dump path every
        rank can write (``TORCH_FR_DUMP_TEMP_FILE``, older torch:
        ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``); then compare the ranks' dumps with ``torchfrtrace``.

        The dump path can be on the shared run directory. The cost is a ring buffer per process
        group.

    References
        snowflakedb/ArcticTraining#219 (the hint next to the failure detected by the watchdog),
        pytorch/pytorch#139659 (the watchdog prints the recorded call-time stack when the
        recorder is on), pytorch/tutorials#3040 (the settings).
    """

    code = "SD519"
    name = "flight-recorder-off"
    severity = Severity.WARNING
    headline = "no Flight Recorder trace of the failed collective"
    patterns = (
        r"Stack trace of the failed collective not found, potentially because FlightRecorder is "
        r"disabled",
    )
