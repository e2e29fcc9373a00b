"""CUDA telemetry inside a rank that uses CUDA: sync markers and allocator figures.

Inert until the job itself has initialised CUDA (the agent thread checks
``torch.cuda.is_initialized()`` on an already imported torch; it never imports torch and never
initialises CUDA). Then every phase entry and every collective entry records a CUDA event on the
caller's current stream (from a pool, no synchronisation), and the agent thread polls the events
in order: "the host is at marker N, the GPU has completed up to marker M". The allocator figures
(``torch.cuda.memory_stats``) are read by the agent thread too, never in the hot path.

CUDA graph capture (vLLM captures at start-up, ``torch.compile(mode="reduce-overhead")`` on the
fly) is left alone: no marker is recorded while the caller's stream is capturing (it would join
the graph), and the agent thread puts itself in the relaxed capture mode before it queries an
event. In the default (global) mode, a query from any thread during another thread's capture is
refused and ends that capture with an error: the job's, not ours (PyTorch's NCCL watchdog does
the same for its own queries, pytorch/pytorch#104555, #148594).
"""
from __future__ import annotations

import collections
import ctypes
import time
from dataclasses import dataclass
from typing import Any

MAX_PENDING = 4096      # markers the GPU has not reached yet; beyond that, new ones are skipped
RELAXED = 2             # CUstreamCaptureMode: CU_STREAM_CAPTURE_MODE_RELAXED
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
        self.off = ""           # why markers are not taken (the allocator figures still are)

    def mark(self, kind: str, name: Any, seq: int) -> None:
        """Hot path: record an event on the current stream."""
        if self.error or self.off or len(self.pending) >= MAX_PENDING:
            return
        try:
            if self.torch.cuda.is_current_stream_capturing():
                return
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
    """CudaMarkers once the job's own torch has initialised CUDA; None before (or never).
    Called on the agent thread, which it first puts in the relaxed capture mode."""
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_initialized():
        return None
    markers = CudaMarkers(torch)
    markers.off = relax_capture_mode()
    return markers


def driver() -> Any:
    """The CUDA driver library the job has loaded already."""
    return ctypes.CDLL("libcuda.so.1")


def relax_capture_mode() -> str:
    """Put the calling thread in the relaxed stream-capture mode, so that its event queries are
    never refused during the job's own graph captures ("" when done, else why not: then the
    markers stay off rather than risk a capture)."""
    try:
        mode = ctypes.c_int(RELAXED)
        status = driver().cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    except (OSError, AttributeError) as exc:
        return f"no CUDA driver to set this thread's capture mode ({exc})"
    return "" if status == 0 else f"cuThreadExchangeStreamCaptureMode returned {status}"
