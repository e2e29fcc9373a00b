"""SD122 engine-process-broken."""
from __future__ import annotations

from typing import Any, Iterator

from stalldoc.analysis.stacks import engine_standing, frame_strings
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import EngineState
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule, blamed, rank_evidence

_DEAD_FIX = (
    "The engine cannot run a step again without that process: read the log for how it ended "
    "(vLLM's `Worker proc ... died`, a traceback, the kernel's OOM killer in `dmesg`), fix "
    "that cause and restart the job; on vLLM versions that hang instead of failing when a "
    "worker dies, upgrade.")


class EngineProcessBroken(Rule):
    """A rank waits for its rollout engine (vLLM, SGLang), and a process of that engine is
    stopped or dead.

    What it does
        At a stall, for each rank whose main thread waits for its own engine (in vLLM's code:
        ``LLM.generate``, a colocated engine's step; on the pipes of the SGLang schedulers it
        holds; a served engine is SD117's), reads the state of that engine's processes in the
        process table: its engine core and its workers (SGLang's schedulers), known by what
        they are (the worker's own TP world, created by the engine's code; the engine core
        that started them), never by their names. One that is stopped (SIGSTOP, a debugger, a
        job-control or cgroup freeze), a zombie or gone is named with its role, its pid and,
        for a stopped one, where it stands (its stack read without pausing it), beside the
        rank's frame and phase.

    Why is this bad?
        An engine runs every step on all of its processes: while one of them is stopped or
        dead, no step completes. The rank waits in ``generate`` (vLLM's own RPC timeout is
        long, and some versions never notice a dead worker), the GPUs hold their memory at
        0 % and, in colocated training, every other rank waits for it in the next collective.

    Evidence
        the rank's frames and phase; the engine's processes with their state (the broken ones
        first); each broken process's role, TP rank, state, and for a stopped one its frame
        and frames; ``blamed`` (pid, what): the broken processes.

    Fix
        A stopped engine process: continue it (`kill -CONT PID`) and find what stopped it: a
        debugger attached to it, a `kill -STOP`, a terminal's Ctrl-Z, a scheduler's suspend
        (the cgroup freezer). A dead or gone one: read the log for how it ended and restart.

        For a dead or gone process the finding's own fix says what to read: vLLM's ``Worker
        proc ... died``, a traceback, the kernel's OOM killer in ``dmesg``; on vLLM versions
        that hang instead of failing when a worker dies, upgrade.

    References
        vllm-project/vllm#2050 (a Ray worker of a TP=2 engine died, every request stuck with
        no error, the main process alive), vllm-project/vllm#16259 (vLLM still runs after its
        Ray workers crash), vllm-project/vllm PR#15000 (a worker's exception left vLLM
        accepting requests and making no progress), huggingface/trl#3433 and PR#6628 (a
        data-parallel vLLM worker exits, the server waits on its pipe for good and the
        training ranks reach an NCCL timeout).
    """

    code = "SD122"
    name = "engine-process-broken"
    severity = Severity.ERROR

    def check(self, window: Window) -> Iterator[Finding]:
        live = {r.rank for r in window.ranks} - {e.rank for e in window.exits}
        for rank in sorted(live - set(window.served)):
            ev = rank_evidence(window, rank)
            broken = [e for e in window.engines if e.process.owner == rank and e.broken]
            if not broken or not ev.get("waits_on_engine"):
                continue
            engine = ev["waits_on_engine"][0]["engine"]
            summary = f"rank {rank} waits for its {engine} engine {_where(ev)}: " + "; ".join(
                _doing(e) for e in broken)
            fix = None if all(e.stopped for e in broken) else _DEAD_FIX
            yield self.finding([rank], summary, {
                **ev, "broken": [_evidence(e) for e in broken],
                **blamed((e.process.pid, e.process.title) for e in broken)}, fix=fix)


def _where(ev: dict[str, Any]) -> str:
    """'in main (rollout.py:35), phase generate, for 17 s'."""
    parts = [f"in {ev['frame']}" if ev["frame"] else "at an unknown frame"]
    if ev["phase"]:
        parts.append(f"phase {ev['phase']}")
    if ev["seconds_without_progress"] is not None:
        parts.append(f"for {ev['seconds_without_progress']:.0f} s")
    return ", ".join(parts)


def _doing(state: EngineState) -> str:
    """'its vLLM worker (TP rank 0) of rank 0's engine (pid 202), stopped at
    execute_model (...): the engine runs no step until it is continued'."""
    where = engine_standing(state.stacks)
    at = f" at {where}" if where else ""
    if state.stopped:
        return (f"{state.process.title} (pid {state.process.pid}) is {state.state}{at}, and "
                "the engine runs no step until it is continued")
    return (f"{state.process.title} (pid {state.process.pid}) is {state.state}, and the "
            "engine cannot run a step again")


def _evidence(state: EngineState) -> dict[str, Any]:
    main = state.stacks.main if state.stacks else None
    frame = engine_standing(state.stacks)
    return {"pid": state.process.pid, "role": state.process.role,
            "tp_rank": state.process.tp_rank, "state": state.state,
            "frame": str(frame) if frame else "", "frames": frame_strings(main)}
