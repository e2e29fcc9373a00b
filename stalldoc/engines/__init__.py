"""What stalldoc knows of each rollout engine, one module per engine (``vllm.py``,
``sglang.py``): its Python package, the functions of its source where a thread waits for its
peers, what its own processes are called, and the claim a process of the world it creates makes.
Data only: the agent reads it inside every rank, the stages (detect, analysis, probes) in the
sidecar. A new engine is one module here, listed in ``ENGINES``, plus its rules.

May import: nothing of stalldoc's (data only: ``engines`` itself).
"""
from __future__ import annotations

from stalldoc.engines.facts import Engine, HookPoint, WaitFrame
from stalldoc.engines.sglang import SGLANG
from stalldoc.engines.vllm import VLLM

ENGINES: tuple[Engine, ...] = (VLLM, SGLANG)
# the claim sources of an engine's own world, in the agent's state file order (vLLM's first)
CLAIM_SOURCES: tuple[str, ...] = tuple(e.claim for e in ENGINES)

__all__ = ["CLAIM_SOURCES", "ENGINES", "SGLANG", "VLLM", "Engine", "HookPoint", "WaitFrame",
           "by_claim",
           "by_module", "by_name", "by_wait", "wait_frames"]


def by_module(name: str) -> Engine | None:
    """The engine whose package a module of this name belongs to (``vllm.distributed.utils``:
    vLLM), None for any other module."""
    top = name.split(".", 1)[0]
    return next((e for e in ENGINES if e.package == top), None)


def by_name(name: str) -> Engine | None:
    """The engine of this name ("vLLM", "SGLang"), None for any other."""
    return next((e for e in ENGINES if e.name == name), None)


def by_claim(source: str) -> Engine | None:
    """The engine whose world a process of this claim source joined, None for a job's rank."""
    return next((e for e in ENGINES if e.claim == source), None)


def by_wait(why: str) -> Engine | None:
    """The engine whose collective a stack's wait names (``vLLM TP collective``: vLLM)."""
    return next((e for e in ENGINES if why in (e.tp_collective, e.collective)), None)


def wait_frames() -> tuple[WaitFrame, ...]:
    """Every engine's wait frames, each engine's in its own order."""
    return tuple(frame for engine in ENGINES for frame in engine.waits)
