"""A rank that serves: its main thread runs an HTTP server (vLLM's OpenAI API server,
``trl vllm-serve``, ``swift rollout``), its work is its clients' requests, and a vLLM server says
what its engine does in its own Prometheus metrics."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerMetrics:
    """A vLLM server's ``/metrics`` at one read, summed over its engines (data parallel). The
    request gauges are what the engine core last published: a core stuck in a step publishes
    nothing, and they keep their last values."""

    running: int
    waiting: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    kv_cache_usage: float | None = None   # the fraction of the KV cache in use
    read_at: float = 0.0

    def describe(self) -> str:
        kv = (f", KV cache {self.kv_cache_usage * 100:.0f} % used"
              if self.kv_cache_usage is not None else "")
        return (f"{self.running} request(s) running, {self.waiting} waiting{kv}, "
                f"{self.preemptions} preemption(s), {self.generation_tokens} token(s) generated")

    def as_dict(self) -> dict[str, object]:
        return {"running": self.running, "waiting": self.waiting,
                "prompt_tokens": self.prompt_tokens,
                "generation_tokens": self.generation_tokens, "preemptions": self.preemptions,
                "kv_cache_usage": self.kv_cache_usage}


@dataclass(frozen=True)
class ServedRank:
    """A rank serving HTTP at ``url``: whether its engine waits for requests (every engine core
    of it blocked for new ones, by its agent), and its vLLM metrics as last read."""

    rank: int
    pid: int
    url: str
    engine_idle: bool = False
    metrics: ServerMetrics | None = None
    metrics_error: str = ""
    in_flight: int | None = None   # HTTP requests its server holds (None: not known)


@dataclass(frozen=True)
class JobServer:
    """A process of the job that serves HTTP and is no rank, below a rank of a distributed job
    (a reward model or rollout server a trainer rank started as its child) or below none (a
    Ray driver's reward server): a part of the job its ranks may wait on, not a rank's own
    serving."""

    pid: int
    owner: int | None              # the rank it is below (None: below no rank)
    url: str
    command: str = ""
    in_flight: int | None = None   # HTTP requests it holds (None: not known)
    thread: str = ""               # the thread that handles a request, where one was seen
    frame: str = ""                # that thread's innermost frame of the server's own code
    waits_on: str = ""             # what that thread waits on ('' when it works)

    def describe(self) -> str:
        """'pid 6605 (python serve.py --port 8000), a server below rank 0 at
        http://127.0.0.1:8000, holding 1 request it has not answered, its thread "worker" in
        score (serve.py:40) waiting on a lock'."""
        what = f" ({self.command})" if self.command else ""
        held = ""
        if self.in_flight is not None:
            held = (f", holding {self.in_flight} request{'s' if self.in_flight != 1 else ''}"
                    " it has not answered" if self.in_flight else ", holding no request")
        at = ""
        if self.frame:
            doing = f" waiting on a {self.waits_on}" if self.waits_on else " working"
            at = f", its thread \"{self.thread}\" in {self.frame}{doing}"
        return f"pid {self.pid}{what}, {self.place}{held}{at}"

    @property
    def place(self) -> str:
        """'a server below rank 0 at URL', 'a server of the job at URL' (below no rank)."""
        whose = f"below rank {self.owner}" if self.owner is not None else "of the job"
        return f"a server {whose} at {self.url}"

    def as_dict(self) -> dict[str, object]:
        return {"pid": self.pid, "rank": self.owner, "url": self.url, "command": self.command,
                "in_flight": self.in_flight, "thread": self.thread, "frame": self.frame,
                "waits_on": self.waits_on}
