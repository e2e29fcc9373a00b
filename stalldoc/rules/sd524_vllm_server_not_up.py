"""SD524 vllm-server-not-up."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class VllmServerNotUp(LogSignature):
    """TRL's vLLM client is polling a server that does not answer.

    What it does
        Matches TRL's ``trl.extras.vllm_client - Server is not up yet. Retrying in N
        seconds...`` and its final ``The vLLM server can't be reached at HOST:PORT after N
        seconds``.

    Why is this bad?
        In server mode (use_vllm with vllm_mode="server", TRL's default before colocate existed)
        every rank polls /health/ before its first rollout; with no server the job idles with
        its GPUs empty, then fails after vllm_server_timeout.

    Evidence
        the lines and how often they came; the retry interval, the seconds waited.

    Fix
        Start the server first, on GPUs the trainer does not use (``CUDA_VISIBLE_DEVICES=0 trl
        vllm-serve --model ...``), point vllm_server_host / vllm_server_port (or
        vllm_server_base_url) at it, and raise vllm_server_timeout if it loads slowly; on one node
        without a spare GPU use vllm_mode="colocate" instead.

    References
        huggingface/open-r1#568, huggingface/open-r1#543,
        philschmid/deep-learning-pytorch-huggingface#83.
    """

    code = "SD524"
    name = "vllm-server-not-up"
    severity = Severity.WARNING
    headline = "vLLM server not up, the trainer keeps retrying"
    patterns = (
        r"Server is not up yet\. Retrying in (?P<retry_seconds>[\d.]+) seconds",
        r"The vLLM server can't be reached at (?P<server>\S+) after (?P<waited_seconds>[\d.]+) "
        r"seconds",
    )
