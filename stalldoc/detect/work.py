"""Evidence of work: what one tick's samples say about a rank, and the verdict.

A rank shows work when its agent's markers or collectives move (or its CUDA markers complete, or
the job logs a progress line), when it or its descendants read or write bytes, when its
descendants burn CPU, or when it burns CPU (or its GPU is busy) in a stack that is working rather
than waiting. CPU spent spinning inside a wait is not work. A process that spent most of the
time runnable but waiting for a CPU wanted that CPU: on an oversubscribed node a rank importing
torch may get 4% of a core and be working all the same (its stack decides, as for CPU it got).
A busy rank whose stack has not been classified yet is "pending": it is never taken for stuck,
but it does not end a stall either.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from stalldoc.detect.stack_kind import StackKind
from stalldoc.model.samples import HostSample

BUSY_CPU_PERCENT = 10.0        # the rank's own CPU above this is busy: its stack decides
CHILD_CPU_PERCENT = 10.0       # its descendants' CPU above this is work
IO_WORK_BPS = 64 * 1024        # bytes read + written per second above this is work
GPU_BUSY_UTIL = 5              # GPU utilisation (%) above this is busy: the stack decides
# Runnable but waiting for a CPU above this (% of one core, over all its threads) is busy when
# its own CPU is not: it is starved, the stack decides. Well above what a waiting rank queues
# for when its threads wake under load (16% seen for a gloo rank in all_reduce on an
# oversubscribed core); a rank that works there queues nearly all the time (180-220% seen).
STARVED_WAIT_PERCENT = 50.0

WORK, IDLE, PENDING = "work", "idle", "pending"


IO_WINDOW = 5.0   # seconds over which a rank's I/O rate is averaged


@dataclass
class RecentRate:
    """A rate averaged over the last IO_WINDOW seconds of ticks: I/O comes in bursts (a write
    is counted when its syscall returns, a 4 MB write to slow storage after a second or so)."""

    ticks: deque[tuple[float, float]] = field(default_factory=deque)   # (t, bytes/s)

    def add(self, now: float, rate: float) -> float:
        self.ticks.append((now, rate))
        while self.ticks and self.ticks[0][0] < now - IO_WINDOW:
            self.ticks.popleft()
        if len(self.ticks) < 2 or self.ticks[-1][0] <= self.ticks[0][0]:
            return rate
        ticks = list(self.ticks)
        total = sum(rate * (t - t0) for (t0, _), (t, rate) in zip(ticks, ticks[1:]))
        return round(total / (ticks[-1][0] - ticks[0][0]), 1)


@dataclass(frozen=True)
class Signals:
    """What one tick's probes saw of one rank."""

    progressed: bool                 # markers / collectives / CUDA markers / progress lines
    host: HostSample | None
    gpu_util: int | None = None
    io_average: float | None = None  # bytes/s over the last few seconds (to say the rate)

    @property
    def busy(self) -> bool:
        """Burning CPU or starved of it, or its GPU busy: work or a spinning wait, the stack
        tells which."""
        cpu = self.host.cpu_percent if self.host else None
        return ((cpu or 0.0) >= BUSY_CPU_PERCENT or self.starved
                or (self.gpu_util or 0) >= GPU_BUSY_UTIL) and not self.stopped

    @property
    def starved(self) -> bool:
        """Little CPU, yet runnable and waiting for one most of the time."""
        if self.host is None:
            return False
        return ((self.host.cpu_percent or 0.0) < BUSY_CPU_PERCENT
                and (self.host.cpu_wait_percent or 0.0) >= STARVED_WAIT_PERCENT)

    @property
    def stopped(self) -> bool:
        return self.host is not None and self.host.status == "stopped"


def _mb(bps: float) -> str:
    return f"{bps / 1e6:.1f} MB/s" if bps >= 1e5 else f"{bps / 1e3:.0f} kB/s"


def verdict(signals: Signals, stack: StackKind | None) -> tuple[str, str, str]:
    """(work / idle / pending, what decided it, the reason in words) for one rank at one tick.

    What decided it is one of: stopped, progress, io, children, quiet, unclassified, stack,
    spinning."""
    host = signals.host
    if signals.stopped:
        return IDLE, "stopped", "stopped (SIGSTOP)"
    if signals.progressed:
        return WORK, "progress", "progress markers moved"
    if host is not None and (host.io_bps or 0.0) >= IO_WORK_BPS:
        rate = signals.io_average if signals.io_average is not None else host.io_bps or 0.0
        return WORK, "io", f"reading / writing {_mb(rate)}"
    if host is not None and _children_work(host):
        return WORK, "children", _children_reason(host)
    if not signals.busy:
        return IDLE, "quiet", "no CPU, I/O, GPU or progress"
    what = ("GPU busy" if (signals.gpu_util or 0) >= GPU_BUSY_UTIL
            else _starved(host) if host is not None and signals.starved else "CPU busy")
    if stack is None or not stack.kind:
        return PENDING, "unclassified", f"{what}, stack not classified yet"
    if stack.working:
        return WORK, "stack", f"{what} in {stack.frame}" if stack.frame else what
    if signals.starved:
        # runnable in a wait: its threads wake (timers, polls) and queue for a CPU; not work
        return IDLE, "spinning", f"{what} while {stack.kind}"
    if what == "CPU busy" and not stack.on_cpu:
        # every Python thread blocked in the kernel, yet the CPU burns: native threads work
        # (teardown, a C++ pool); it is not a Python thread spinning in its wait
        return PENDING, "unclassified", "CPU busy in native code while its Python threads wait"
    return IDLE, "spinning", f"{what} spinning while {stack.kind}"


def _children_work(host: HostSample) -> bool:
    """Its descendants burn CPU, or their main threads queue for one most of the time."""
    return ((host.children_cpu_percent or 0.0) >= CHILD_CPU_PERCENT
            or (host.children_cpu_wait_percent or 0.0) >= STARVED_WAIT_PERCENT)


def _children_reason(host: HostSample) -> str:
    wait = host.children_cpu_wait_percent or 0.0
    waited = f", waiting for a CPU {wait:.0f}%" if wait >= STARVED_WAIT_PERCENT else ""
    return (f"{host.children} child process(es) at {host.children_cpu_percent or 0.0:.0f}% "
            f"CPU{waited}")


def _starved(host: HostSample) -> str:
    """A rank that wanted CPU and did not get it, in words."""
    return (f"runnable, waiting for a CPU {host.cpu_wait_percent or 0.0:.0f}% "
            f"(ran {host.cpu_percent or 0.0:.0f}%)")
