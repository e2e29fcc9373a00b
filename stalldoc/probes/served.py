"""Served engines: where a rank serves HTTP (its agent's ``served-<pid>.txt``, written when
uvicorn starts serving on the process's main thread: ``agent/hooks.served``), and a vLLM
server's own Prometheus metrics at ``/metrics`` (running and waiting requests, prompt and
generation tokens, KV-cache usage, preemptions). Only the URL the server itself listens on is
read, never a port guessed from a command line; proxies in the environment are bypassed."""
from __future__ import annotations

import re
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from stalldoc.agent.statefile import requests_path, served_path
from stalldoc.model.served import ServerMetrics

MAX_METRICS_BYTES = 4 << 20
_URL = re.compile(r"^https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$")
# sample name -> field; vLLM before 0.10 named the KV-cache gauge gpu_cache_usage_perc
_SAMPLES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
            "vllm:prompt_tokens_total": "prompt_tokens",
            "vllm:generation_tokens_total": "generation_tokens",
            "vllm:num_preemptions_total": "preemptions",
            "vllm:kv_cache_usage_perc": "kv_cache_usage",
            "vllm:gpu_cache_usage_perc": "kv_cache_usage"}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def served_url(directory: str | None, pid: int) -> str | None:
    """The URL process ``pid`` last started serving at; None when it serves nothing (or the
    file is not a URL the agent writes)."""
    if not directory:
        return None
    try:
        with open(served_path(directory, pid), encoding="utf-8", errors="replace") as fh:
            lines = fh.read(4096).split()
    except OSError:
        return None
    url = lines[-1] if lines else ""
    return url if _URL.match(url) else None


def read_requests(directory: str | None, pid: int) -> tuple[int, int] | None:
    """(requests in flight, requests taken so far) of the server of process ``pid``, as its
    agent last wrote them; None where it wrote none (no uvicorn whose counts it can read)."""
    if not directory:
        return None
    try:
        with open(requests_path(directory, pid), "rb") as fh:
            fields = fh.read(64).split()
    except OSError:
        return None
    if len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None   # not written yet, or not our record
    return int(fields[0]), int(fields[1])


def parse_metrics(text: str, read_at: float = 0.0) -> ServerMetrics | None:
    """A vLLM server's metrics from its ``/metrics`` text; None when it has none of them (not a
    vLLM server, or text that is not Prometheus')."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                field = _SAMPLES.get(sample.name)
                if field is not None:
                    found[field] = found.get(field, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):
        return None
    if "running" not in found and "generation_tokens" not in found:
        return None
    return ServerMetrics(*(int(found.get(f, 0.0)) for f in (
        "running", "waiting", "prompt_tokens", "generation_tokens", "preemptions")),
        kv_cache_usage=found.get("kv_cache_usage"), read_at=read_at)


def read_metrics(url: str, timeout: float = 2.0) -> tuple[ServerMetrics | None, str]:
    """(the server's vLLM metrics, "") or (None, why not: no answer in time, an HTTP error, no
    vLLM metrics there)."""
    try:
        with _OPENER.open(f"{url}/metrics", timeout=timeout) as reply:
            text = reply.read(MAX_METRICS_BYTES).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return None, f"{url}/metrics answered HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"{url}/metrics did not answer in {timeout:.0f} s ({reason})"
    metrics = parse_metrics(text, time.time())
    return (metrics, "") if metrics is not None else (None, f"{url}/metrics has no vLLM metrics")
