"""vLLM engines' sleep state from their own log lines, for engines the agent's hooks do not see
(an engine core in a process of its own, a job without the agent).

vLLM's executor logs ``It took %.6f seconds to fall asleep.`` once an engine sleeps and
``It took %.6f seconds to wake up tags %s.`` (older versions: ``... to wake up.``) once it woke
(the lines' shapes: ``stalldoc/engines/vllm.py``). A line's engine is the process prefix vLLM puts in front of its
worker processes' lines (``(EngineCore_DP0 pid=4123)``), else the launcher's prefix of the rank
that printed it (torchrun ``--tee``: ``[default1]:``), else one engine for the job: colocated
engines of several ranks printing without a prefix are told apart by the agent only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from stalldoc.engines import vllm
from stalldoc.model.agent import EngineSleepState
from stalldoc.model.samples import LogLine

_ASLEEP = re.compile(vllm.ASLEEP_LINE)
_WOKEN = re.compile(vllm.WOKEN_LINE)
_PROCESS = re.compile(vllm.PROCESS_PREFIX)
_LAUNCHER = re.compile(r"^\[(?P<tag>[A-Za-z_]+(?P<local_rank>\d+))\]:")
_TAG_NAMES = vllm.SLEEP_TAGS
MAX_ENGINES = 64   # distinct prefixes kept; a job with more engines keeps its first ones


def engine_of(text: str) -> str:
    """The engine a vLLM log line comes from: its process prefix, else the rank's launcher
    prefix, else 'vLLM engine'."""
    match = _PROCESS.search(text)
    if match:
        return f"{match['name']} pid={match['pid']}"
    rank = _LAUNCHER.match(text)
    return f"[{rank['tag']}]" if rank else "vLLM engine"


def woken_tags(tags: str | None) -> tuple[str, ...]:
    """The tags a wake-up line names (all of them when it names none that are known: vLLM
    prints the sleeping tags for a wake_up() without tags)."""
    named = tuple(t for t in _TAG_NAMES if t in (tags or ""))
    return named or _TAG_NAMES


@dataclass
class _Engine:
    asleep_at: float
    woken_at: float | None = None
    sleeps: int = 1
    wakes: int = 0
    tags: set[str] = field(default_factory=set)

    def state(self) -> str:
        if len(self.tags) == len(_TAG_NAMES):
            return "awake"
        return "partly awake" if self.tags else "asleep"


@dataclass
class SleepLog:
    """Each engine's sleep state as its log lines tell it; fed with every drained line."""

    engines: dict[str, _Engine] = field(default_factory=dict)

    def feed(self, lines: Iterable[LogLine]) -> None:
        for line in lines:
            if "It took" not in line.text:   # the cheap test first: every line passes here
                continue
            if _ASLEEP.search(line.text):
                self._asleep(engine_of(line.text), line.t)
            else:
                woken = _WOKEN.search(line.text)
                if woken:
                    self._woken(engine_of(line.text), line.t, woken_tags(woken["tags"]))

    def _asleep(self, name: str, t: float) -> None:
        engine = self.engines.get(name)
        if engine is None:
            if len(self.engines) < MAX_ENGINES:
                self.engines[name] = _Engine(t)
            return
        engine.asleep_at, engine.sleeps, engine.tags = t, engine.sleeps + 1, set()

    def _woken(self, name: str, t: float, tags: tuple[str, ...]) -> None:
        engine = self.engines.get(name)
        if engine is not None:
            engine.woken_at, engine.wakes = t, engine.wakes + 1
            engine.tags.update(tags)

    def states(self) -> tuple[EngineSleepState, ...]:
        """Every engine seen falling asleep, as the rules see it."""
        return tuple(EngineSleepState(name, e.state(), e.asleep_at, e.woken_at, None, e.sleeps,
                                      e.wakes, tuple(sorted(e.tags)), "log", local_rank(name))
                     for name, e in self.engines.items())


def local_rank(engine: str) -> int | None:
    """The local rank of an engine named by the launcher's prefix ('[default1]' -> 1)."""
    match = _LAUNCHER.match(engine + ":")
    return int(match["local_rank"]) if match else None
