"""SD507 rollout-server-unreachable."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class RolloutServerUnreachable(LogSignature):
    """The rollout (vLLM server mode) server cannot be reached.

    What it does
        Matches ``Servers not reachable after Ns``.

    Why is this bad?
        Every rank that needs a rollout waits on it; the training side looks hung with the GPU idle.

    Evidence
        the lines, how long swift waited.

    Fix
        Check that ``swift rollout`` is running and healthy, and that --vllm_server_host /
        --vllm_server_port point at it (a port taken by another process makes the server move to the
        next one); unset http_proxy / https_proxy for the trainer; raise --vllm_server_timeout while
        the server still loads.

    References
        ms-swift GRPO server mode docs; modelscope/ms-swift#5911 (``Servers not reachable
        after 10.0s`` when GRPO training starts beside ``swift rollout``).
    """

    code = "SD507"
    name = "rollout-server-unreachable"
    severity = Severity.ERROR
    headline = "rollout server not reachable"
    patterns = (
        r"Servers not reachable after (?P<waited_seconds>[\d.]+)s",
    )
