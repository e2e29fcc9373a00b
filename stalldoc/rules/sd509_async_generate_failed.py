"""SD509 async-generate-failed."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class AsyncGenerateFailed(LogSignature):
    """An asynchronous rollout failed; the queue it should fill stays empty.

    What it does
        Matches ``Inference task failed:``, ``Error in async_generate_rollout callback:`` and
        Python's ``exception calling callback for <Future ...>``, printed when the rollout future
        of async_generate raised.

    Why is this bad?
        With async_generate the trainer waits on a queue that the failed task was to fill: the
        error is printed once, then the job is silent forever (the async-generate deadlock).

    Evidence
        the lines (the exception follows them in the log), the ranks that printed them.

    Fix
        Read the exception that follows the line and fix it; until then run with --async_generate
        false (colocate mode does not support it anyway), so that such errors stop the job instead
        of hanging it.

    References
        ms-swift issue #3401 (zero3_offload + async_generate hang); ms-swift GRPO docs;
        modelscope/ms-swift#3666 (AssertionError in the callback, gone with --async_generate
        false).
    """

    code = "SD509"
    name = "async-generate-failed"
    severity = Severity.ERROR
    headline = "asynchronous rollout failed"
    patterns = (
        r"Inference task failed:",
        r"Error in async_generate_rollout callback:",
        r"exception calling callback for <Future at 0x[0-9a-f]+ state=finished raised "
        r"(?P<exception>\w+)>",
    )
