"""Reading stacks: which source lines take a lock."""
from __future__ import annotations

from stalldoc.analysis.stacks import is_lock_line, waits_on_http
from stalldoc.model.stacks import Frame, ThreadStack


def test_a_lock_line_is_code_that_takes_a_lock_not_a_word_in_a_comment():
    """A job script's `with open(shard) as fh:  # blocks here on a stuck mount` was read as a
    lock (SD104) because "blocks" holds "lock"."""
    taking = ["with self._lock:", "    with cache_lock:", "with threading.Lock():",
              "lk.acquire()", "async with self.sem:", "with cond:"]
    not_taking = ["with open(p) as fh:  # blocks here", "with self._blocking_io():",
                  "x = 1  # lock.acquire(", "with clock_source():"]
    assert [is_lock_line(t) for t in taking] == [True] * len(taking)
    assert [is_lock_line(t) for t in not_taking] == [False] * len(not_taking)



def _thread(*files: str) -> ThreadStack:
    frames = tuple(Frame("f", name, 1) for name in files) + (Frame("rollout", "/job/t.py", 9),)
    return ThreadStack(1, "MainThread", False, False, frames)


def test_only_a_plain_http_client_is_a_wait_on_http():
    lib = "/usr/lib/python3.11"
    assert waits_on_http(_thread(f"{lib}/socket.py", f"{lib}/http/client.py"))
    assert waits_on_http(_thread(f"{lib}/socket.py", "/venv/site-packages/httpx/_client.py"))
    # TLS, gRPC and a raw socket: their server is not asked for /metrics over plain HTTP
    assert not waits_on_http(_thread(f"{lib}/ssl.py", f"{lib}/http/client.py"))
    assert not waits_on_http(_thread("/venv/site-packages/grpc/_channel.py"))
    assert not waits_on_http(_thread(f"{lib}/socket.py"))
