"""SD545 hub-network-error."""
from __future__ import annotations

from typing import Any, Mapping

from stalldoc.model.findings import Severity
from stalldoc.rules.log_kind import LogKind

_STATUS = (r"\b[45]\d\d (?:Client|Server) Error: .*? for (?:url|URL): \S+",
           r"\bwandb: \d{3} encountered",
           r"\bError while calling W&B API: .*<Response \[\d{3}\]>")
_TIMEOUT = (r"\bRead timed out\.", r"\bConnection to \S+ timed out\. \(connect timeout=",
            r"\bwandb: ERROR Run initialization has timed out after ",
            r"\bMax retries exceeded with url: ",
            r"\bwandb: Network error \(\w+\), entering retry loop",
            r"\bRead timeout on endpoint URL: ",
            r"\bConnect timeout on endpoint URL: ")
_UNREACHABLE = (r"\bWe couldn't connect to '[^']+' to load",
                r"\bTemporary failure in name resolution",
                r"\bFailed to resolve '[^']+'",
                r"\bLocalEntryNotFoundError: ", r"\bOfflineModeIsEnabled: ",
                r"\bwandb\.errors\.CommError: ")
_WORDINGS = {"an error status": _STATUS, "a timeout or retry": _TIMEOUT,
             "unreachable": _UNREACHABLE}
_BY_STATUS = {
    429: "The hub or tracker rate-limits the job (HTTP 429): every rank of every node asks at "
         "once. Download once before the launch (`huggingface-cli download`, then "
         "`HF_HUB_OFFLINE=1`), log from rank 0 only, or use a token with a higher limit.",
    401: "The hub refused the job's credentials (HTTP 401): log in (`huggingface-cli login`, "
         "`HF_TOKEN`) with access to the gated or private repository on every node.",
    403: "The hub forbade the request (HTTP 403): accept the model's licence on its page, or "
         "use a token with access to it, on every node.",
    404: "The hub has no such file or repository (HTTP 404): check the model or dataset id and "
         "revision, or the local path the job meant.",
}


class HubNetworkError(LogKind):
    """A model hub or an experiment tracker refused, timed out or could not be reached.

    What it does
        Matches the kind in any library's words: an HTTP error status from requests
        (``429 Client Error: Too Many Requests for url: ...``) or W&B (``Error while calling
        W&B API: ... (<Response [502]>)``, ``wandb: 429 encountered``), read and connect
        timeouts (``Read timed out. (read timeout=10)``, ``Max retries exceeded with url``,
        botocore's ``Read timeout on endpoint URL``), W&B's ``Network error (ReadTimeout),
        entering retry loop``, and a hub that cannot be reached (``We couldn't connect to
        'https://huggingface.co' to load``, a name that does not resolve). A rollout or reward
        server's errors are SD507, SD525 and SD526.

    Why is this bad?
        Every rank of every node asks the hub at once at start-up and is rate-limited or times
        out, and a rank that is still retrying holds the others in their first collective; a
        tracker's client that retries blocks the rank that logs (rank 0) while the rest wait
        for it. The job looks hung with no error of its own.

    Evidence
        the lines; ``what`` (an error status, a timeout or retry, unreachable), the parts the
        lines carry: ``http_status``, ``url`` (without credentials, query or fragment),
        ``host``, ``port``; the ranks that printed them.

    Fix
        Take the network out of the job's start: download the model and data once before the
        launch and run with `HF_HUB_OFFLINE=1`; log to the tracker from rank 0 only, or offline
        (`WANDB_MODE=offline`, `wandb sync` later); give the client a timeout it can keep.

    References
        huggingface/transformers#21129 (from_pretrained fails: the Hub rate-limits the config.json
        request (the second line of the OSError)); huggingface/transformers#34841 (Internal runs
        are rate-limited by the Hub when many jobs fetch model configs at once);
        huggingface/datasets#6488 (Loading an already downloaded dataset still calls the Hub API
        and is rate-limited (429)); wandb/wandb#5286 (wandb.init cannot reach the W&B server: retry
        loop, then CommError and abnormal exit); wandb/wandb#10044 (wandb.init cannot connect to
        api.wandb.ai; init times out after 90 s); Comfy-Org/ComfyUI#1549 (Offline nodes keep trying
        to reach huggingface.co for model files and time out on connect);
        instructlab/instructlab#2837 (ilab model train in an offline environment fails to resolve
        the model config from the Hub); cnulab/RealNet#34 (Training start fails fetching pretrained
        weights: connect to huggingface.co times out); h2oai/h2ogpt#533 (A model shard download
        from the Hub's LFS CDN times out mid-download during a Hub outage);
        yxKryptonite/OpenFMNav#4 (The program cannot reach the Hub for bert-base-uncased and
        sleeps/retries); wandb/wandb#5372 (During a W&B backend incident the client loops:
        ReadTimeout, then repeated 500 responses and HTTPError retry loops); mlflow/mlflow#6012
        (Ray Tune's MLflowLoggerCallback: the tracking server answers 500 repeatedly and the whole
        training run fails (host redacted as 'xxx' by the reporter)); mlflow/mlflow#6169
        (MlflowClient.log_batch against a local tracking server: repeated 500 responses exhaust
        urllib3's retries).
    """

    code = "SD545"
    name = "hub-network-error"
    kind = "network"
    severity = Severity.WARNING
    headline = "a hub or tracker request failed"
    wordings = _WORDINGS

    def fix_for(self, evidence: Mapping[str, Any]) -> str | None:
        status = evidence.get("http_status")
        return _BY_STATUS.get(status) if isinstance(status, int) else None
