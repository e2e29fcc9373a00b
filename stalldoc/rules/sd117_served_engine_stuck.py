"""SD117 served-engine-stuck."""
from __future__ import annotations

from typing import Any, Iterator

from stalldoc.model.findings import Finding, Severity
from stalldoc.model.served import ServedRank
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, blamed, rank_evidence, stuck_for

_FIX = ("Find why the engine stopped stepping: the engine process named here (a stopped one: "
        "`kill -CONT` it and find who stopped it; a dead one: its log's last error, SIGKILL "
        "is the OOM killer), else its stack (`py-spy dump --pid` of the engine core and each "
        "worker). Give the clients a request timeout so that a hung server becomes an error "
        "in the trainer, not a silent wait.")


class ServedEngineStuck(Rule):
    """A rank that serves rollouts over HTTP holds requests its engine does not answer.

    What it does
        At a stall, looks at the ranks that serve HTTP on their main thread (their agent saw
        uvicorn start: vLLM's OpenAI API server, ``trl vllm-serve``, ``swift rollout``) and
        whose engine is not waiting for requests (its engine core is in a step, or has no agent
        to say so): the server took requests in and no forward pass has run since. Names the
        engine process that cannot answer (stopped, dead or gone) when there is one, and
        quotes the server's own ``/metrics`` as last read (running and waiting requests,
        KV-cache usage, preemptions, tokens generated). A server without a vLLM engine (a
        reward model's, say) is judged by the requests it holds, as uvicorn counts them: one
        holding none is not stalled however long nobody asks; one holding requests it does not
        answer is named with how many.

    Why is this bad?
        Every client waits: the trainer's ranks sit in their HTTP call to the rollout server,
        their GPUs idle, and the server's own log is silent. vLLM's request gauges keep the
        values of the engine's last step, so a dashboard of them shows a quiet server, not a
        hung one.

    Evidence
        the rank, the URL it serves, the engine processes with their states (stopped, dead or
        gone first), ``in_flight`` (the requests its server holds, where its agent counted
        them), the server's last vLLM metrics and when they were read (or why they could
        not be), the rank's frames, seconds without progress; ``blamed`` (pid, what), the
        engine processes that cannot answer (stopped, dead or gone), when there are.

    Fix
        Follow the engine process named: resume a stopped one (``kill -CONT``) and find who
        stopped it, read a dead one's last error (SIGKILL: the OOM killer), else take its stack
        (``py-spy dump --pid``). Give the clients' requests a timeout.

    References
        vllm-project/vllm issues #2731 (nothing generated while requests run and wait; the
        server still answers /health and /metrics), #17972 (the server hangs after its first
        requests, "Running: 1 reqs" and 0 tokens/s for minutes), #1492 (an OpenAI server hangs
        with no error); vLLM docs, Production Metrics. Not seen: an engine core whose own
        input thread hangs (#47958) blocks in its wait for requests, which reads as a server
        with none: no stall is declared there.
    """

    code = "SD117"
    name = "served-engine-stuck"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        if window.stall is None:
            return
        for rank, served in sorted(window.served.items()):
            engines = _engines(window, rank)
            if served.engine_idle or rank not in {r.rank for r in window.ranks} \
                    or (not engines and served.in_flight == 0):
                continue
            evidence = {**rank_evidence(window, rank), "url": served.url,
                        "waits_on_engine": engines, "in_flight": served.in_flight,
                        **_metrics(served), **blamed((e["pid"], e["what"]) for e in engines
                                                     if e["broken"])}
            summary = (f"rank {rank} serves {served.url} and {_answers(engines, served)}"
                       f"{_which(engines)}{_since(window, rank)}{_said(served)}")
            fix = _FIX if not engines or not engines[0]["broken"] else None
            yield self.finding([rank], summary, evidence, fix)


def _engines(window: Window, rank: int) -> list[dict[str, Any]]:
    states = sorted((e for e in window.engines if e.process.owner == rank),
                    key=lambda e: (not e.broken, e.process.role != "worker", e.process.pid))
    return [{"pid": e.process.pid, "what": e.process.title, "role": e.process.role,
             "tp_rank": e.process.tp_rank, "state": e.state, "broken": e.broken}
            for e in states]


def _answers(engines: list[dict[str, Any]], served: ServedRank) -> str:
    """What does not answer: its vLLM engine, else the server itself (a server of its own, a
    reward model's: the requests it holds, where its agent counted them)."""
    if engines:
        return "its engine answers no request"
    if served.in_flight:
        held = f"{served.in_flight} request{'s' if served.in_flight > 1 else ''}"
        return f"answers none of the {held} it holds"
    return "answers no request"


def _which(engines: list[dict[str, Any]]) -> str:
    if engines and engines[0]["broken"]:
        first = engines[0]
        return f": its {first['what']} (pid {first['pid']}) is {first['state']}"
    if engines:
        return ": " + "; ".join(f"{e['what']} pid {e['pid']} {e['state']}" for e in engines)
    return ""


def _since(window: Window, rank: int) -> str:
    seconds = stuck_for(window, rank)
    return f", for {seconds:.0f} s" if seconds is not None else ""


def _said(served: ServedRank) -> str:
    if served.metrics is not None:
        return (f"; vLLM's metrics, as of its last finished step: "
                f"{served.metrics.describe()}")
    return f"; {served.metrics_error}" if served.metrics_error else ""


def _metrics(served: ServedRank) -> dict[str, Any]:
    if served.metrics is None:
        return {"metrics": None, "metrics_error": served.metrics_error}
    return {"metrics": served.metrics.as_dict(), "metrics_read_at": served.metrics.read_at}
