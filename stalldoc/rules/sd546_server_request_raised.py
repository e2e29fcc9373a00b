"""SD546 server-request-raised."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.rules.log_signature import LogSignature


class ServerRequestRaised(LogSignature):
    """An HTTP server of the job raised while it answered a request, and answered 500.

    What it does
        Matches uvicorn's ``Exception in ASGI application`` (every FastAPI / Starlette server:
        vLLM's OpenAI API server, ``trl vllm-serve``, ``swift rollout``, a reward model's
        server) and its access log's ``"POST /path HTTP/1.1" 500 Internal Server Error``.

    Why is this bad?
        The client got a 500 instead of its answer. A trainer that checks the status fails at
        once. One that does not goes on as if the call worked: TRL's weight update posted
        ``/update_named_param/`` and then waited in the weight-sync group's barrier for a
        server that never joined it. The ranks then wait with nothing more in the log.

    Evidence
        the lines (the server's traceback follows the first); ``method`` and ``path`` of the
        request that failed, from the access log's line.

    Fix
        Read the server's traceback after the line: its last line is the error, and its
        innermost frame of the server's own code is where it was raised. Fix that and restart
        the server. Make the client raise on a status other than 200
        (``response.raise_for_status()``), so that a failed request ends the step instead of
        leaving the ranks to wait.

    References
        vllm-project/vllm#5881 (an OpenAI server's request raises: Exception in ASGI
        application), vllm-project/vllm#5901 (the access log's 500 Internal Server Error for
        /v1/chat/completions once the async engine died), langchain-ai/langserve#403
        (Exception in ASGI application under concurrent requests); huggingface/trl#3676 and
        huggingface/trl#3690 (trl vllm-serve's update_named_param fails and the trainer,
        which did not check the answer, hangs in the weight sync).
    """

    code = "SD546"
    name = "server-request-raised"
    severity = Severity.WARNING
    headline = "a server of the job raised on a request"
    patterns = (
        r"\bException in ASGI application\b",
        r"\"(?P<method>GET|POST|PUT|PATCH|DELETE) (?P<path>/\S*) HTTP/[\d.]+\" 500\b",
    )
