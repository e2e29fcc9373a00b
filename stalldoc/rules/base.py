"""The rule interface, and the evidence helpers every rule uses to describe a rank."""
from __future__ import annotations

import inspect
import re
import signal
from abc import ABC, abstractmethod
from dataclasses import asdict
from typing import Any, ClassVar, Iterable, Iterator

from stalldoc.analysis.causes import (Cause, colocated_tp_size, difference_cause,
                                      engine_collective_cause)
from stalldoc.analysis.stacks import (blocked_in_io, child_wait, compiling, engine_code,
                                      engine_standing, frame_strings, in_process_engine,
                                      user_frame, waits_on_lock)
from stalldoc.analysis.train_barrier import train_barrier_cause
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.window import Window

DOC_SECTIONS = ("What it does", "Why is this bad?", "Evidence", "Fix")
_SECTION_HEADING = re.compile(r"^\S.*$", re.M)   # a section's heading starts its line
_CODE_QUOTES = re.compile(r"``(.+?)``", re.S)


def doc_section(doc: str, heading: str) -> str:
    """The body of section ``heading`` of a rule's docstring (dedented), '' when it has none."""
    match = re.search(rf"^{re.escape(heading)}:?\n", doc, re.M)
    if match is None:
        return ""
    rest = doc[match.end():]
    end = _SECTION_HEADING.search(rest)
    return inspect.cleandoc(rest[:end.start()] if end else rest)


def printed_fix(doc: str) -> str:
    """What a finding prints as its fix: the first paragraph of the docstring's Fix section, on
    one line, with ``code`` quoted as `code` (the rest of the section is for ``explain``)."""
    first = doc_section(doc, "Fix").split("\n\n")[0]
    return _CODE_QUOTES.sub(r"`\1`", " ".join(first.split()))


class Rule(ABC):
    """One cause of a stall. ``check`` looks at a Window and yields findings."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    trigger: ClassVar[str] = "stall"   # "stall": on a detected stall; "exit": when a rank ends;
                                       # "tick": every tick (cheap rules; their findings have a life)
    fallback: ClassVar[bool] = False   # runs only when no other rule explained the stall
    sticky: ClassVar[bool] = False     # tick findings that are events: never resolved by silence
    ends_with_progress: ClassVar[bool] = False   # tick findings about ranks without progress:
                                                 # resolved once all their ranks progressed
    settle_seconds: ClassVar[float] = 0.0   # tick findings about a trend over steps: resolved
                                            # only once they have not held for this long
    fix: ClassVar[str]                 # derived: the first paragraph of the docstring's Fix

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A rule's fix is written once, in its docstring's Fix section: ``fix`` is derived from
        it. A rule (a class with a ``code``) that sets ``fix`` itself, or has no Fix section,
        is refused at import."""
        super().__init_subclass__(**kwargs)
        if "fix" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: write the fix in the docstring's Fix section, "
                            "not as a `fix` attribute (Rule derives it)")
        fix = printed_fix(inspect.cleandoc(cls.__doc__ or ""))
        if fix:
            cls.fix = fix
        elif "code" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: a rule needs a Fix section in its docstring")

    @abstractmethod
    def check(self, window: Window) -> Iterator[Finding]:
        """Yield a finding for each occurrence of this cause in the window."""

    def finding(self, ranks: tuple[int, ...] | list[int], summary: str,
                evidence: dict[str, Any], fix: str | None = None,
                severity: Severity | None = None) -> Finding:
        """A finding of this rule (its own severity unless this occurrence is graver or milder)."""
        return Finding(self.code, self.name, severity or self.severity, tuple(sorted(ranks)),
                       summary, evidence, fix or self.fix)

    def caused(self, ranks: tuple[int, ...] | list[int], summary: str,
               evidence: dict[str, Any], cause: Cause | None) -> Finding:
        """The finding, with its cause (its sentence, ``evidence.cause``) and the cause's fix
        where the evidence decided one."""
        if cause is None:
            return self.finding(ranks, summary, evidence)
        return self.finding(ranks, f"{summary}; {cause.says}",
                            {**evidence, "cause": cause.evidence()}, cause.fix)

    @classmethod
    def doc(cls) -> str:
        return inspect.getdoc(cls) or ""


def blamed(processes: Iterable[tuple[int, str]]) -> dict[str, Any]:
    """``evidence.blamed``: the processes a finding blames that are no rank (an engine process
    that died, a server of the job's that holds requests it does not answer), each by pid and
    what it is; empty when the finding blames its ranks alone."""
    found = [{"pid": pid, "what": what} for pid, what in processes]
    return {"blamed": found} if found else {}


def cause_of(window: Window, culprits: Iterable[int], waiting: Iterable[int]) -> Cause | None:
    """Why ``culprits`` are missing from the collective ``waiting`` sit in, from the window's
    Flight Recorder dumps, stacks and the job's latest output (None where they do not say)."""
    sizes = {rank: size for rank, settings in window.engine_settings.items()
             if (size := colocated_tp_size(settings)) is not None}
    return (train_barrier_cause(window.stacks, culprits, waiting)
            or engine_collective_cause(window.stacks, culprits, waiting, sizes)
            or difference_cause(window.flight, window.stacks, culprits, waiting,
                                window.log_tail))


def phase_of(window: Window, rank: int) -> str:
    """The rank's innermost phase from its agent ('' when unknown)."""
    agent = window.agents.get(rank)
    return agent.phase if agent else ""


def phase_stack_of(window: Window, rank: int) -> list[str]:
    """The rank's phases, outermost first ([] when unknown)."""
    agent = window.agents.get(rank)
    return list(agent.phase_stack) if agent else []


def stuck_for(window: Window, rank: int) -> float | None:
    """Seconds since the rank last made progress."""
    last = window.last_progress.get(rank)
    return round(window.now - last, 1) if last is not None else None


def rank_evidence(window: Window, rank: int) -> dict[str, Any]:
    """Frames (innermost first), the user's frame, phase and time without progress of a rank."""
    stacks = window.stacks.get(rank)
    main = stacks.main if stacks else None
    frame = user_frame(main) if main else None
    evidence = {"frames": frame_strings(main), "frame": str(frame) if frame else "",
                "phase": phase_of(window, rank), "phase_stack": phase_stack_of(window, rank),
                "seconds_without_progress": stuck_for(window, rank),
                "stack_method": stacks.method if stacks else "none"}
    child = waited_child(window, rank)
    engine = waited_engine(window, rank, main)
    evidence = {**evidence, "waits_on_engine": engine} if engine else evidence
    kernel = kernel_wait_of(window, rank)
    evidence = {**evidence, "kernel_wait": kernel} if kernel else evidence
    return {**evidence, "waits_on_child": child} if child else evidence


def kernel_wait_of(window: Window, rank: int) -> dict[str, Any] | None:
    """The I/O system call the rank's main thread is blocked in, while its stack does not work
    (a file, a pipe, a device or a socket that does not answer: the kernel's side of a Python
    frame stopped in a C call); None otherwise."""
    wait = window.kernel.get(rank)
    if wait is None or not blocked_in_io(window.stacks.get(rank), wait):
        return None
    return {**asdict(wait), "words": wait.words()}


def waited_engine(window: Window, rank: int, main: Any) -> list[dict[str, Any]]:
    """The rank's engine processes, each with its state, when the rank's main thread waits for
    its engine: it is in the engine's code (``LLM.generate`` waiting for vLLM's engine core),
    or it waits on its children's pipes while they are the schedulers of an engine it holds
    in-process (SGLang's); the stopped, dead or gone ones first. Each says where it stands
    (``frame``, '' where its stack was not read) and whether it is inside torch.compile
    (``compiling``). [] otherwise."""
    name = engine_code(main) or _in_process_engine(window, rank, main)
    states = [e for e in window.engines if e.process.owner == rank and e.process.engine == name]
    states.sort(key=lambda e: (not e.broken, e.process.role != "worker", e.process.pid))
    return [{"pid": e.process.pid, "what": e.process.title, "role": e.process.role,
             "tp_rank": e.process.tp_rank, "state": e.state, "broken": e.broken,
             "engine": e.process.engine, "frame": str(engine_standing(e.stacks) or ""),
             "compiling": compiling(e.stacks)}
            for e in states] if name else []


def _in_process_engine(window: Window, rank: int, main: Any) -> str:
    """The engine whose schedulers are the rank's children, while the rank waits on a child's
    pipe ('' when it does not, or no such engine is the rank's)."""
    if child_wait(main) != "child process":
        return ""
    return next((e.process.engine for e in window.engines if e.process.owner == rank
                 and in_process_engine(e.process.engine)), "")


def waited_child(window: Window, rank: int) -> dict[str, Any] | None:
    """The first child process the rank waits on whose stack is in code outside libraries (a
    DataLoader worker in the dataset's ``__getitem__``): its pid, frame and frames; None when
    the rank waits on no child or no child's stack says more than the library's wait loop."""
    children = window.children.get(rank, ())
    if not children:
        return None
    rank_stacks = window.stacks.get(rank)
    what = child_wait(rank_stacks.main if rank_stacks else None) or "child process"
    for child in children:
        main = child.main
        frame = user_frame(main) if main else None
        if frame is not None and not _bootstrap(frame):
            return {"pid": child.pid, "what": what, "frame": str(frame),
                    "waits_on_lock": waits_on_lock(main) is not None,
                    "frames": frame_strings(main), "stack_method": child.method}
    return None


def _bootstrap(frame: Any) -> bool:
    """A ``python -c`` program's own line: what a child runs under when only library code is
    above it (multiprocessing's spawned processes and its resource tracker): not the child's
    code."""
    return frame.filename == "<string>" and frame.function == "<module>"


def describe(window: Window, rank: int) -> str:
    """'in load_shard (data.py:88), phase rollout, for 14 s' — as much as is known; for a rank
    waiting on a child process, where that child is."""
    ev = rank_evidence(window, rank)
    parts = [f"in {ev['frame']}" if ev["frame"] else "at an unknown frame"]
    if ev.get("waits_on_engine"):
        parts[0] += _engine_wait(ev["waits_on_engine"])
    if ev.get("kernel_wait"):
        parts[0] += f", {ev['kernel_wait']['words']}"
    if ev.get("waits_on_child"):
        child = ev["waits_on_child"]
        lock = "waits on a lock in" if child["waits_on_lock"] else "is in"
        parts[0] += (f" waiting for its {child['what']} {child['pid']}, which {lock} "
                     f"{child['frame']}")
    if ev["phase"]:
        parts.append(f"phase {ev['phase']}")
    if ev["seconds_without_progress"] is not None:
        parts.append(f"for {ev['seconds_without_progress']:.0f} s")
    return ", ".join(parts)


def _engine_wait(engines: list[dict[str, Any]]) -> str:
    """' waiting for its vLLM engine, whose vLLM worker (TP rank 0) of rank 0's engine (pid
    4711) is stopped' — the first engine process that cannot answer, else each one's state and
    where it stands ('... pid 4711 sleeping in SpinCondition.wait (shm_broadcast.py:210)')."""
    first = engines[0]
    if first["broken"]:
        return f" waiting for its {first['engine']} engine, whose {first['what']} (pid " \
               f"{first['pid']}) is {first['state']}"
    states = "; ".join(f"{e['what']} pid {e['pid']} {e['state']}"
                       + (f" in {e['frame']}" if e.get("frame") else "")
                       + (", compiling (torch.compile)" if e.get("compiling") else "")
                       for e in engines)
    return f" waiting for its {first['engine']} engine ({states})"


def signal_name(sig: int | None) -> str:
    """'SIGABRT', or 'signal 99' for a number that names none."""
    try:
        return signal.Signals(sig or 0).name
    except ValueError:
        return f"signal {sig}"


def join_ranks(ranks: Any) -> str:
    """'rank 3', 'ranks 0,1', 'ranks 0-10,12-15' (runs of three or more as a range)."""
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(_runs(ranks))


def _runs(ranks: list[int]) -> list[str]:
    out: list[str] = []
    start = 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            out += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(r) for r in run]
            start = i
    return out
