"""SD526 rollout-connection-dropped."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class RolloutConnectionDropped(LogSignature):
    """The rollout server closed the trainer's HTTP connection mid-request.

    What it does
        Matches ``RemoteDisconnected('Remote end closed connection without response')`` and
        ``http.client.RemoteDisconnected``, and ``Max retries exceeded with url: /<endpoint>/`` for
        the endpoints of TRL's and swift's vLLM servers (update_named_param, generate,
        init_communicator, infer, ...).

    Why is this bad?
        The server crashed, restarted or dropped the request during weight sync or generation.
        The rank that got the error dies; the other ranks wait for it in the next collective
        until the NCCL timeout.

    Evidence
        the lines, the ranks that printed them; the endpoint where printed.

    Fix
        Read the server's log at that moment (EngineDeadError or OOM: SD520); use a TRL version
        whose VLLMClient retries requests, restart the server and resume from the last checkpoint.
        If weight sync overloads the server, sync less often or with fewer, larger requests.

        LoRA, or a newer client that batches parameters, sends fewer, larger requests.

    References
        huggingface/trl#3622, huggingface/trl#3347, sgl-project/sglang#4848 (weight update to an
        sglang server), huggingface/trl#4845 (retries in VLLMClient).
    """

    code = "SD526"
    name = "rollout-connection-dropped"
    severity = Severity.ERROR
    headline = "rollout server dropped the connection"
    patterns = (
        r"RemoteDisconnected\('Remote end closed connection without response'\)",
        r"http\.client\.RemoteDisconnected: Remote end closed connection without response",
        r"Max retries exceeded with url: /(?P<endpoint>update_named_param|update_flattened_params|"
        r"generate|chat|init_communicator|close_communicator|reset_prefix_cache|get_world_size|"
        r"health|infer|update_adapter_flattened_param)/",
    )
