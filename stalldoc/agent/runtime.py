"""The in-process agent: one per Python process of the watched job, started by sitecustomize.

It owns the state file, a daemon heartbeat thread, the phase stack and the collective counters.
Everything it does is guarded: the first failure is written once to the run directory, the agent
switches itself off, and the training process runs on untouched. Standard library only.
"""
from __future__ import annotations

import _signal   # not signal: its import would be most of the agent's start-up cost
import atexit
import faulthandler
import os
import sys
import time

from stalldoc.agent import identity, primitives, statefile
from stalldoc.agent.statefile import ENV_AGENT_DIR

TYPE_CHECKING = False   # not typing's: the agent does not import typing (start-up cost)
if TYPE_CHECKING:
    from typing import IO, Any

    from stalldoc.agent import cuda as cuda_telemetry

ENV_WATCHER_PID = "STALLDOC_WATCHER_PID"
ENV_DUMP_SIGNAL = "STALLDOC_DUMP_SIGNAL"
ENV_AGENT_OFF = "STALLDOC_AGENT_OFF"   # features left off: "collectives,c10d,flight,cuda,hooks"
FEATURES = ("collectives", "c10d", "flight", "cuda", "hooks")
# A real-time signal nobody sends a training job: SIGUSR1 / SIGUSR2 are schedulers' and
# frameworks' (Slurm --signal, submitit, Lightning's requeue) and end a job that leaves
# them alone; the dump must change nothing of what a signal from someone else does
DEFAULT_DUMP_SIGNAL = "SIGRTMAX-2"
HEARTBEAT_SECONDS = 0.25
ALLOCATOR_EVERY_BEATS = 4   # allocator figures once a second
ERROR_LOG = "agent-errors.log"
_PR_SET_PTRACER = 0x59616D61
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC

_AGENT: Agent | None = None


def feature_off(feature: str) -> bool:
    """Whether ``STALLDOC_AGENT_OFF`` (a comma-separated list of ``FEATURES``) turns it off."""
    return feature in os.environ.get(ENV_AGENT_OFF, "").replace(" ", "").split(",")


def signal_number(name: str) -> int:
    """A signal's number from its name (``SIGUSR2``, ``SIGRTMAX-2``, ``SIGRTMIN+3``, ``44``);
    0 where it names none."""
    for base in ("SIGRTMIN", "SIGRTMAX"):
        if name.startswith(base):
            offset = name[len(base):] or "0"
            if offset[:1] not in "+-" and offset != "0" or not offset.lstrip("+-").isdigit():
                return 0
            number = getattr(_signal, base) + int(offset)
            return number if _signal.SIGRTMIN <= number <= _signal.SIGRTMAX else 0
    value = int(name) if name.isdigit() else getattr(_signal, name, None)
    return value if isinstance(value, int) and 0 < value <= _signal.SIGRTMAX else 0


def _env_int(name: str, default: int = -1) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Agent:
    """Writes this process's progress into its state file."""

    def __init__(self, directory: str, started: float | None = None) -> None:
        self.directory = directory
        self.started = time.perf_counter() if started is None else started
        self.pid = os.getpid()
        now = time.time()
        self.state = statefile.StateWriter(
            statefile.state_path(directory, self.pid), self.pid, _env_int("RANK"),
            _env_int("LOCAL_RANK"), _env_int("WORLD_SIZE"), now)
        self.enabled = True
        self.claimed = 0   # the source of this process's rank claim (statefile.CLAIM_SOURCES)
        self.status = statefile.STATUS_RUNNING
        self.marker_seq = 0
        self.phase_count = 0
        self.phases: list[tuple[str, float, str, float]] = []   # name, start, detail, since
        self.phase_threads: list[int] = []   # the native id of the thread that entered each
        self.kinds: list[int] = []           # each open phase's kind (statefile.phase_kind)
        self.kind_entries = [0] * len(statefile.PHASE_KINDS)
        self.kind_seconds = [0.0] * len(statefile.PHASE_KINDS)
        self.kind_counted_at = now           # the seconds are counted up to here
        self.tickers: list[Any] = []   # callables of the hooks, called with the time each beat
        self.groups: dict[str, statefile.GroupRing] = {}
        self.rings: dict[int, statefile.GroupRing] = {}
        self.dump_file: IO[str] | None = None
        self.cuda: cuda_telemetry.CudaMarkers | None = None
        self._allocator: tuple[tuple[int, int, int, int, int] | None, float] = (None, 0.0)
        self._cuda_off = feature_off("cuda")
        self._cuda_module: Any = None
        # the Flight Recorder dumper; None: not looked at, False: off
        self._flight: Any = False if feature_off("flight") else None
        self._versions: Any = None   # the versions publisher; None: not made yet, False: done
        self._ray: Any = None        # the Ray facts publisher; None: not made yet, False: done
        # the process groups' counters; None: not made yet, False: off
        self._c10d: Any = False if feature_off("c10d") else None
        self._gate: Any = None   # the door of the heartbeat's calls into torch (torch_gate.py);
                                 # None: not made yet, False: off after a failure

    # ----- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        _threading_from_main_thread()
        self._mark_when_finished()
        primitives.start_new_thread(self._beat, ())   # daemonic: never delays the job's exit
        atexit.register(self._at_exit)
        self._chain_excepthook()
        self._allow_ptrace()
        dump_signal = self._register_dump_signal()
        exe = os.stat("/proc/self/exe") if os.path.exists("/proc/self/exe") else None
        self.claim(identity.from_environment(os.environ))
        self.state.identity(dump_signal, exe.st_dev if exe else 0, exe.st_ino if exe else 0,
                            time.perf_counter() - self.started, _comm())

    def claim(self, claim: identity.Claim) -> None:
        """Publish which rank this process is (``agent/identity.py``); one made from the
        process group replaces one from the environment, not the other way round. A rank that
        had left its world and joins one again runs again."""
        if claim[0] and claim[0] >= self.claimed:
            self.claimed = claim[0]
            self.state.claim(*claim)
        if claim[0] == statefile.SOURCE_GROUP and self.status == statefile.STATUS_LEFT:
            self.set_status(statefile.STATUS_RUNNING)

    def _beat(self) -> None:
        beats = 0
        while True:
            primitives.sleep(HEARTBEAT_SECONDS)
            if not self.enabled:
                return
            now = time.time()
            self.guard(self.state.heartbeat, now)
            for ticker in self.tickers:
                self.guard(ticker, now)
            beats += 1
            if "torch" in sys.modules and self._gate is not False:
                self._through_gate(self._torch_ticks, now, beats % ALLOCATOR_EVERY_BEATS == 1)
            self._versions_tick()
            self._ray_tick()

    def _through_gate(self, fn: Any, *args: Any) -> None:
        """``fn`` behind the torch gate (``agent/torch_gate.py``): never while the interpreter
        finalizes, when a daemon thread inside torch's C++ aborts the whole process."""
        try:
            if self._gate is None:
                from stalldoc.agent.torch_gate import TorchGate
                self._gate = TorchGate()
            self._gate.call(fn, *args)
        except Exception as exc:  # noqa: BLE001 - no calls into torch; the agent stays on
            self._gate = False
            report_failure(self.directory, exc, "torch telemetry disabled")

    def _torch_ticks(self, now: float, allocator: bool) -> None:
        """Every call of the heartbeat into torch: CUDA markers, Flight Recorder, c10d."""
        self._cuda_tick(now, allocator)
        self._flight_tick()
        self._c10d_tick(now)

    def _c10d_tick(self, now: float) -> None:
        """Publish the collectives issued on the process groups, C++ ones (DDP's reducer)
        included (``agent/c10d_counters.py``): nothing before torch.distributed is imported."""
        if self._c10d is False or "torch.distributed" not in sys.modules:
            return
        try:
            if self._c10d is None:
                from stalldoc.agent import c10d_counters
                self._c10d = c10d_counters.wanted(os.environ) and c10d_counters.C10dCounters()
            counters = self._c10d
            if not counters:
                return
            if counters.read():
                self.state.c10d(counters.total, now, counters.groups)
        except Exception as exc:  # noqa: BLE001 - no c10d counters; the agent stays on
            self._c10d = False
            report_failure(self.directory, exc, "c10d counters disabled")

    def _versions_tick(self) -> None:
        """Publish the versions this process runs with, for the watcher (``agent/versions.py``):
        once torch is imported, or after a while without it."""
        if self._versions is False:
            return
        try:
            if self._versions is None:
                from stalldoc.agent.versions import VersionsPublisher
                self._versions = VersionsPublisher(self.directory, self.pid)
            self._versions.tick()
            if self._versions.done:
                self._versions = False
        except Exception as exc:  # noqa: BLE001 - no versions; the agent stays on
            self._versions = False
            report_failure(self.directory, exc, "versions not published")

    def _ray_tick(self) -> None:
        """Publish what this process is to Ray (``agent/ray_facts.py``): nothing before the job
        imported ray."""
        if self._ray is False or "ray" not in sys.modules:
            return
        try:
            if self._ray is None:
                from stalldoc.agent.ray_facts import RayFacts
                self._ray = RayFacts(self.directory, self.pid, sys.modules)
            self._ray.tick()
            if self._ray.done:
                self._ray = False
        except Exception as exc:  # noqa: BLE001 - no Ray facts; the agent stays on
            self._ray = False
            report_failure(self.directory, exc, "Ray facts not published")

    def _flight_tick(self) -> None:
        """Answer the watcher's request for a Flight Recorder dump (``agent/flight.py``): one
        stat per beat once torch.distributed is imported, nothing before."""
        if self._flight is False or "torch.distributed" not in sys.modules:
            return
        try:
            if self._flight is None:
                from stalldoc.agent import flight
                self._flight = flight.from_env(self.directory) or False
            if self._flight:
                self._flight.poll()
        except Exception as exc:  # noqa: BLE001 - dumps off; the agent stays on
            self._flight = False
            report_failure(self.directory, exc, "flight recorder dumps disabled")

    def _cuda_tick(self, now: float, allocator: bool) -> None:
        """Attach to CUDA once the job initialised it; poll markers; read the allocator."""
        if self._cuda_off:
            return
        if "torch" not in sys.modules:
            return   # no CUDA without torch: its telemetry module is not even imported
        try:
            cuda_telemetry = self._cuda_module or self._import_cuda()
            if self.cuda is None:
                self.cuda = cuda_telemetry.attach(sys.modules)
                allocator = True
                if self.cuda is not None and self.cuda.off:
                    report_failure(self.directory, RuntimeError(self.cuda.off),
                                   "CUDA markers off (allocator figures kept)")
            markers = self.cuda
            if markers is None:
                return
            if markers.error:
                raise RuntimeError(markers.error)
            markers.poll(now)
            if allocator:
                figures = markers.allocator()
                self._allocator = (figures.as_tuple(), now) if figures else self._allocator
            self.state.cuda(*self._allocator, markers.host_seq, markers.gpu_seq,
                            cuda_telemetry.label(*markers.host_label),
                            cuda_telemetry.label(*markers.gpu_label), markers.gpu_at,
                            markers.oldest_pending_at())
        except Exception as exc:  # noqa: BLE001 - CUDA telemetry off; the agent stays on
            self.cuda = None
            self._cuda_off = True
            report_failure(self.directory, exc, "CUDA telemetry disabled")

    def _import_cuda(self) -> Any:
        """The CUDA telemetry module, imported once (not on every beat of this thread)."""
        from stalldoc.agent import cuda as cuda_telemetry
        self._cuda_module = cuda_telemetry
        return cuda_telemetry

    def _mark_when_finished(self) -> None:
        """Have Python say when the job's script returns: ``threading._shutdown`` runs its own
        exit calls first, before it waits for the job's threads that are not daemons, and before
        the ``atexit`` handlers. What holds a finished process is then one of those."""
        import threading
        register = getattr(threading, "_register_atexit", None)   # Python 3.9+
        if register is not None:
            self.guard(register, self._finished)

    def _finished(self) -> None:
        """The script returned (in this process, not a child forked from it)."""
        if self.enabled and os.getpid() == self.pid:
            self.guard(self._write_finished)

    def _write_finished(self) -> None:
        fd = open_record(statefile.finished_path(self.directory, self.pid))
        try:
            os.write(fd, f"{time.time():.3f}".encode("ascii"))
        finally:
            os.close(fd)

    def _at_exit(self) -> None:
        """The interpreter exits (every other atexit handler has run): exited, unless an
        uncaught exception already said how it ends."""
        if self.enabled and self.status != statefile.STATUS_EXCEPTION:
            self.guard(self.set_status, statefile.STATUS_EXITED)

    def set_status(self, status: int) -> None:
        self.status = status
        self.state.status(status)

    def teardown(self, inside: bool, done: bool = False) -> None:
        """The job entered (``inside``) or left ``destroy_process_group()`` of every group:
        a crash in between is one in torch's teardown, after the distributed work. Left with
        the call ``done`` (it returned), the rank has left its world: its distributed work is
        over (``STATUS_LEFT``); a call that raised leaves it running."""
        if inside and self.status in (statefile.STATUS_RUNNING, statefile.STATUS_LEFT):
            self.set_status(statefile.STATUS_TEARDOWN)
        elif not inside and self.status == statefile.STATUS_TEARDOWN:
            self.set_status(statefile.STATUS_LEFT if done else statefile.STATUS_RUNNING)

    def _chain_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            if self.enabled and not _still_handled(tb):
                import traceback
                text = "".join(traceback.format_exception_only(kind, value)).strip()
                self.guard(self._record_exception, text)
            previous(kind, value, tb)

        sys.excepthook = hook

    def _record_exception(self, text: str) -> None:
        from stalldoc.redact import redact_text   # only once, as the process dies
        self.state.error(redact_text(text))
        self.set_status(statefile.STATUS_EXCEPTION)

    def _allow_ptrace(self) -> None:
        """Let the watcher ptrace us under Yama ptrace_scope=1 without root."""
        watcher = _env_int(ENV_WATCHER_PID)
        if watcher > 0 and _yama_scope() == "1":
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(watcher), 0, 0, 0)  # EINVAL without Yama

    def _register_dump_signal(self) -> int:
        """faulthandler stack dump on a signal: the fallback when ptrace is denied. Returns the
        signal (0: none). The watcher sends it only while this very program still handles it."""
        signum = signal_number(os.environ.get(ENV_DUMP_SIGNAL, DEFAULT_DUMP_SIGNAL))
        if not signum or _signal.getsignal(signum) not in (_signal.SIG_DFL, None):
            return 0
        path = os.path.join(self.directory, f"faulthandler-{self.pid}.txt")
        self.dump_file = open_private(path)
        faulthandler.register(signum, file=self.dump_file, all_threads=True, chain=False)
        return int(signum)

    def detach_after_fork(self) -> None:
        """In a forked child: the file belongs to the parent, so stop writing to it."""
        self.enabled = False
        if self._gate:
            self._gate.forget_after_fork()

    # ----- failure ----------------------------------------------------------------------------
    def guard(self, fn: Any, *args: Any) -> Any:
        """Call ``fn``; on any error disable the agent and return None."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the agent must never raise into the job
            self.fail(exc)
            return None

    def fail(self, exc: BaseException) -> None:
        if not self.enabled:
            return
        self.enabled = False
        report_failure(self.directory, exc)
        try:
            self.state.error(f"agent disabled: {exc!r}")
            self.set_status(statefile.STATUS_DISABLED)
        except Exception:  # noqa: BLE001
            pass

    # ----- phases -----------------------------------------------------------------------------
    def _bump(self, now: float) -> None:
        self.marker_seq += 1
        self.state.marker(self.marker_seq, now)

    def progress(self) -> None:
        """A sign of life from a hooked library call: the marker moves, no phase changes."""
        self._bump(time.time())

    def phase_enter(self, name: str, detail: str = "") -> None:
        now = time.time()
        self._count_kind(now)
        kind = statefile.phase_kind(name)
        if kind >= 0 and kind not in self.kinds:
            self.kind_entries[kind] += 1
            self._write_kind(kind)
        self.kinds.append(kind)
        self.phases.append((name, now, detail, now))
        self._push_thread(primitives.get_native_id())
        self.state.phase_stack([p[0] for p in self.phases])
        if detail:
            self.state.phase_detail(name, now, detail)
        self._bump(now)
        cuda = self.cuda
        if cuda is not None:
            cuda.mark("phase", name, self.marker_seq)

    def phase_exit(self, name: str) -> None:
        now = time.time()
        self._count_kind(now)
        detailed = False
        while self.phases:
            top, started, detail, _ = self.phases.pop()
            if self.kinds:
                self.kinds.pop()
            self._pop_thread()
            detailed = detailed or bool(detail)
            if top == name:
                self.phase_count += 1
                self.state.phase_done(self.phase_count, name, started, now)
                break
        self.state.phase_stack([p[0] for p in self.phases])
        if detailed:
            self._write_detail()
        self._bump(now)

    def _count_kind(self, now: float) -> None:
        """The time since the last count goes to the innermost open phase's kind, if any."""
        innermost = next((kind for kind in reversed(self.kinds) if kind >= 0), -1)
        if innermost >= 0:
            self.kind_seconds[innermost] += now - self.kind_counted_at
        self.kind_counted_at = now
        if innermost >= 0:
            self._write_kind(innermost)

    def _write_kind(self, kind: int) -> None:
        self.state.phase_kind(kind, self.kind_entries[kind], self.kind_seconds[kind],
                              self.kind_counted_at)

    def _push_thread(self, native_id: int) -> None:
        threads = self.phase_threads
        if not threads or threads[-1] != native_id:
            self.state.phase_thread(native_id)
        threads.append(native_id)

    def _pop_thread(self) -> None:
        threads = self.phase_threads
        if threads:
            left = threads.pop()
            if not threads or threads[-1] != left:
                self.state.phase_thread(threads[-1] if threads else 0)

    def channel_enter(self, name: str, detail: str) -> tuple[str, float, str, float] | None:
        """Enter phase ``name`` with ``detail``; when it is already innermost (a client method
        calling another), only its detail changes: the old entry is returned for the exit."""
        if not (self.phases and self.phases[-1][0] == name):
            self.phase_enter(name, detail)
            return None
        now = time.time()
        old = self.phases[-1]
        self.phases[-1] = (name, old[1], detail, now)
        self.state.phase_detail(name, now, detail)
        self._bump(now)
        return old

    def channel_exit(self, name: str, old: tuple[str, float, str, float] | None) -> None:
        if old is None:
            self.phase_exit(name)
            return
        if self.phases and self.phases[-1][0] == name:
            self.phases[-1] = old
        self._write_detail()
        self._bump(time.time())

    def _write_detail(self) -> None:
        """The innermost phase that has a detail into the state file (none: cleared)."""
        for name, _, detail, since in reversed(self.phases):
            if detail:
                self.state.phase_detail(name, since, detail)
                return
        self.state.phase_detail("", 0.0, "")

    # ----- collectives ------------------------------------------------------------------------
    def group_ring(self, name: str) -> statefile.GroupRing:
        """The ring of process group ``name``; groups past the last slot share it."""
        ring = self.groups.get(name)
        if ring is None:
            slot = len(self.groups)
            if slot < statefile.GROUP_SLOTS:
                ring = self.state.group_ring(slot, name)
            else:
                ring = self.groups[next(reversed(self.groups))]
            self.groups[name] = ring
        return ring


def _still_handled(tb: Any) -> bool:
    """Whether the frame where this traceback begins still runs: the exception was caught there
    and only reported through ``sys.excepthook`` (weakref's exit finalizers do so, and vLLM's
    engine shutdown raises in one), so the process goes on and ends with its own status. An
    uncaught exception reaches the hook after every frame of its traceback has returned."""
    if tb is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame is tb.tb_frame:
            return True
        frame = frame.f_back
    return False


def _threading_from_main_thread() -> None:
    """Import ``threading`` here, in the job's main thread, before the heartbeat starts.

    ``threading`` takes the thread that first imports it for the main thread, and at exit the
    interpreter waits for that thread to end. Were it first imported inside the heartbeat (by any
    import there: ``importlib.metadata``, ``json``...), a job that never imported it itself would
    hang at exit forever, waiting for an endless thread, and ``threading.main_thread()`` would
    be the agent's. Imported here, first, it is always the job's (about 0.5 ms, once)."""
    import threading  # noqa: F401 - for its side effect: the main thread is recorded


def open_record(path: str) -> int:
    """``path`` opened for writing in place (a record rewritten at offset 0), created mode 0600
    whatever the job's umask and never through a symbolic link: its descriptor."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def open_private(path: str) -> IO[str]:
    """``path`` opened for appending text, created mode 0600 whatever the job's umask (which
    the agent never changes) and never through a symbolic link."""
    fd = os.open(path, _APPEND_FLAGS, 0o600)
    try:
        return open(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _comm() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as fh:
            return fh.read().strip()
    except OSError:
        return b""


def _yama_scope() -> str:
    """Yama's ptrace_scope ('' without Yama): only scope 1 needs the watcher allowed."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def report_failure(directory: str, exc: BaseException, what: str = "stalldoc agent disabled"
                   ) -> None:
    """Write one line about an agent failure to the run directory. When that fails too (a full
    disk) nothing is written at all: never into the job's own output."""
    line = f"pid {os.getpid()}: {what}: {exc!r}\n"
    try:
        run_dir = os.path.dirname(os.path.abspath(directory))
        with open_private(os.path.join(run_dir, ERROR_LOG)) as fh:
            fh.write(line)
    except Exception:  # noqa: BLE001
        pass


def current() -> Agent | None:
    """The running agent of this process, if any and still enabled."""
    agent = _AGENT
    return agent if agent is not None and agent.enabled else None


def _after_fork_in_child() -> None:
    global _AGENT
    if _AGENT is not None:
        _AGENT.detach_after_fork()
        _AGENT = None


def start_from_env(started: float | None = None) -> Agent | None:
    """Start the agent's runtime if the watcher asked for it (``STALLDOC_AGENT_DIR``); never
    raises. ``started``: ``time.perf_counter()`` when the bootstrap began (for the start-up cost).
    ``agent/start.py`` adds the collective wrappers and the hooks (the bootstrap calls it)."""
    global _AGENT
    directory = os.environ.get(ENV_AGENT_DIR)
    if not directory or _AGENT is not None:
        return _AGENT
    try:
        agent = Agent(directory, started)
        agent.start()
    except Exception as exc:  # noqa: BLE001
        report_failure(directory, exc)
        return None
    _AGENT = agent
    os.register_at_fork(after_in_child=_after_fork_in_child)
    return agent
