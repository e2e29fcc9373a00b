"""SD525 rollout-request-failed."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class RolloutRequestFailed(LogSignature):
    """swift rollout (the vLLM server of GRPO server mode) failed a request of the trainer.

    What it does
        Matches ``[ERROR:swift] Method execution failed: <method>`` printed by ``swift rollout``
        and the trainer's ``Server N failed: <status>``.

    Why is this bad?
        The trainer's ranks wait on the answer (a rollout, a weight update, the weight-sync
        group); a failed ``collective_rpc`` leaves them blocked in the group they were forming,
        a failed ``infer`` ends the step with an error or an empty rollout.

    Evidence
        the lines (the server's traceback follows them); the method, the server and status.

    Fix
        Read the server traceback after the line. collective_rpc right after
        ``/init_communicator/``: install the vLLM version your swift supports on the server and
        restart it. infer / async_infer: fix the error shown (template, multi-turn plugin; an engine
        crash is SD520) and restart ``swift rollout``.

        collective_rpc fails when the server's vLLM lacks what swift calls (e.g. vLLM 0.8's
        AsyncLLMEngine raises NotImplementedError). ``Server N failed``: read that server's log.

    References
        modelscope/ms-swift#6935 (collective_rpc NotImplementedError), modelscope/ms-swift#7933
        (infer after the engine died), modelscope/ms-swift#6041 (async_infer in multi-turn),
        modelscope/ms-swift#7228 (Server 1 failed: 500).
    """

    code = "SD525"
    name = "rollout-request-failed"
    severity = Severity.ERROR
    headline = "rollout server failed a request"
    patterns = (
        r"\[ERROR:swift\] Method execution failed: (?P<method>\w+)",
        r"Server (?P<server>\d+) failed: (?P<status>\d{3})",
    )
