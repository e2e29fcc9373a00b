"""CUDA telemetry inside a rank that uses CUDA: sync markers and allocator figures.

Inert until the job itself has initialised CUDA (the agent thread checks
``torch.cuda.is_initialized()`` on an already imported torch; it never imports torch and never
initialises CUDA). Then every phase entry and every collective entry records a CUDA event on the
caller's current stream (from a pool, no synchronisation), and the agent thread polls the events
in order: "the host is at marker N, the GPU has completed up to marker M". The allocator figures
(``torch.cuda.memory_stats``) are read by the agent thread too, never in the hot path.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

MAX_PENDING = 4096      # markers the GPU has not reached yet; beyond that, new ones are skipped
_STAT_KEYS = ("allocated_bytes.all.current", "reserved_bytes.all.current",
              "allocated_bytes.all.peak", "num_alloc_retries", "num_ooms")


@dataclass(frozen=True)
class Allocator:
    """The caching allocator's figures, summed over the devices this process allocated on."""

    allocated: int
    reserved: int
    peak_allocated: int
    alloc_retries: int
    ooms: int

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.allocated, self.reserved, self.peak_allocated, self.alloc_retries, self.ooms)


def label(kind: str, name: Any, seq: int) -> str:
    """A marker's label: ``phase rollout`` or ``all_reduce#7``."""
    text = name.decode() if isinstance(name, bytes) else str(name)
    return f"phase {text}" if kind == "phase" else f"{text}#{seq}"


class CudaMarkers:
    """Host-side markers and the GPU's progress through them."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.pending: collections.deque[tuple[int, tuple[str, Any, int], Any, float]] = (
            collections.deque())
        self.pool: list[Any] = []
        self.host_seq = 0
        self.host_label: tuple[str, Any, int] = ("", "", 0)
        self.gpu_seq = 0
        self.gpu_label: tuple[str, Any, int] = ("", "", 0)
        self.gpu_at = 0.0
        self.error = ""

    def mark(self, kind: str, name: Any, seq: int) -> None:
        """Hot path: record an event on the current stream."""
        if self.error or len(self.pending) >= MAX_PENDING:
            return
        try:
            event = self.pool.pop() if self.pool else self.torch.cuda.Event()
            event.record()
        except Exception as exc:  # noqa: BLE001 - CUDA broken: markers off, the rest stays on
            self.error = f"CUDA markers off: {exc!r}"
            return
        self.host_seq += 1
        self.host_label = (kind, name, seq)
        self.pending.append((self.host_seq, self.host_label, event, time.time()))

    def poll(self, now: float) -> None:
        """Agent thread: advance over every marker the GPU has completed."""
        while self.pending:
            seq, what, event, _ = self.pending[0]
            if not event.query():
                break
            self.pending.popleft()
            self.pool.append(event)
            self.gpu_seq, self.gpu_label, self.gpu_at = seq, what, now

    def oldest_pending_at(self) -> float:
        """When the oldest marker the GPU has not reached was recorded (0.0: none pending)."""
        pending = self.pending
        return pending[0][3] if pending else 0.0

    def allocator(self) -> Allocator | None:
        """Agent thread: the allocator's figures over all devices it holds memory on."""
        cuda = self.torch.cuda
        totals = [0, 0, 0, 0, 0]
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            for i, key in enumerate(_STAT_KEYS):
                totals[i] += int(stats.get(key, 0))
        return Allocator(*totals)


def attach(modules: dict[str, Any]) -> CudaMarkers | None:
    """CudaMarkers once the job's own torch has initialised CUDA; None before (or never)."""
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_initialized():
        return None
    return CudaMarkers(torch)
