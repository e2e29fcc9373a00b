"""The per-rank shared-memory state file: its binary layout and the writer the agent uses (the
watcher's reader is ``state_reader.py``, kept apart so the agent never imports dataclasses).

The agent maps the file with ``mmap`` and writes into it with ``struct.pack_into``; the page cache
makes every write visible to a reader at once, and the file can still be read after the rank froze,
stopped or died. Standard library only: this module runs inside every training process.

Layout (little endian, ``SIZE`` bytes):

- 0: header (``_HEADER``): magic, version, status, pid, rank, local rank, world size, start time,
  heartbeat, marker sequence, time of the last marker, exit code.
- 128: identity (``_IDENTITY``): the signal the agent registered its faulthandler dump on (0:
  none), the device and inode of the executable it runs in, the agent's start-up cost, and the
  process's name (``/proc/self/comm``: an exec changes it).
- 176: rank claim (``_CLAIM``): how this process knows its rank (an index into ``CLAIM_SOURCES``:
  0 nothing, RANK or a launcher's variable at start, or the process group it created), its global
  rank, local rank, world size, and its world (the store's ``host:port`` or path). Zero in a file
  of an agent that does not write it (the bytes were unused), so it needed no version change.
- 224: c10d counters (``_C10D``, ``agent/c10d_counters.py``): the collectives issued on the
  process groups by their own sequence numbers (DDP's C++ all-reduces included), when that total
  last rose, and how many groups were read. Zero in a file of an agent that does not write it
  (versions 3 and 4 leave these bytes zero), so it needed no version change.
- 248: the thread of the innermost phase (``_U32``): the native id (as ``/proc/PID/task`` and
  py-spy name threads) of the thread that entered it; 0 with no phase or from an older agent.
- 256: current phase stack, ``/``-joined utf-8 with a 2-byte length.
- 768: last error or uncaught exception text, same encoding.
- 1024: completed-phase ring: a count, then ``PHASE_SLOTS`` entries (name, start, end).
- 3088 (version 4): the detail of the innermost phase that has one (a channel: weight sync,
  rollout or reward server): the phase's name, since when, and ``method\tmode\tendpoint`` text.
- 3344 (version 4): ``ENGINE_SLOTS`` vLLM engine sleep states (``_ENGINE``): the engine's key,
  sleeps, wake-ups, state (awake / asleep / partly awake), sleep level, woken tags (a bit mask),
  when it was put to sleep, when it was last woken.
- 3584: CUDA block (``_CUDA``), written by the agent thread only: active flag, allocator figures
  (allocated, reserved, peak allocated, retries, OOMs) and when they were read, the CUDA sync
  markers (host at marker N, GPU completed up to marker M, their labels, when the GPU reached M,
  when the oldest marker it has not reached was recorded).
- 3760: the time of each kind of phase (``PHASE_KINDS``, ``_KIND``): how often a phase of that
  kind was entered (not counting one inside another of its kind), and the seconds it was the
  innermost kind, then when that was last counted. Zero in a file of an agent that does not
  write it (the bytes were unused), so it needed no version change.
- 4096: ``GROUP_SLOTS`` process-group slots: a header (the group's name) and a ring of
  ``RING_SLOTS`` collective entries (seq, numel, entered, completed, op, dtype, flags).

An entry whose completion time is 0.0 has been entered and not completed. The writer keeps no
counters in the header: each collective costs one write on entry and one on return, and the
reader derives the counters from the ring (the newest sequence number is the number started).
"""
from __future__ import annotations

import mmap
import os
import struct

from stalldoc import engines

ENV_AGENT_DIR = "STALLDOC_AGENT_DIR"   # where the agents write: a process without it has none
MAGIC = b"SDAG"
VERSION = 4
READABLE_VERSIONS = (3, 4)   # 4 added the phase detail and the engine sleep states

STATUS_RUNNING = 0
STATUS_EXITED = 1
STATUS_EXCEPTION = 2
STATUS_DISABLED = 3
STATUS_TEARDOWN = 4    # inside the job's destroy_process_group() of every group (version 4 too)
STATUS_LEFT = 5        # destroy_process_group() of every group returned: the rank left its world

_HEADER = struct.Struct("<4sHHIiiiddQdi")
_TEXT_LEN = struct.Struct("<H")
PHASE_STACK_OFFSET = 256
PHASE_STACK_SIZE = 512
ERROR_OFFSET = 768
ERROR_SIZE = 256
PHASE_RING_OFFSET = 1024
PHASE_SLOTS = 32
_PHASE_COUNT = struct.Struct("<Q")
_PHASE_ENTRY = struct.Struct("<48sdd")
GROUP_OFFSET = 4096
GROUP_SLOTS = 8
RING_SLOTS = 64
_GROUP_HEADER = struct.Struct("<40s")
GROUP_HEADER_SIZE = 64
ENTRY = struct.Struct("<QQdd23s8sB")
GROUP_SIZE = GROUP_HEADER_SIZE + RING_SLOTS * ENTRY.size
SIZE = GROUP_OFFSET + GROUP_SLOTS * GROUP_SIZE

FLAG_ASYNC = 1
F64 = _F64 = struct.Struct("<d")
_ENTRY_SIZE = ENTRY.size
RING_MASK = _RING_MASK = RING_SLOTS - 1  # RING_SLOTS is a power of two
_U64 = struct.Struct("<Q")
CUDA_OFFSET = 3584
_CUDA = struct.Struct("<B7xqqqqqdQQdd40s40s")
IDENTITY_OFFSET = 128
_IDENTITY = struct.Struct("<I4xQQd16s")
C10D_OFFSET = 224
_C10D = struct.Struct("<QdI4x")
PHASE_THREAD_OFFSET = 248
_U32 = struct.Struct("<I")
DETAIL_OFFSET = 3088
_DETAIL_HEAD = struct.Struct("<48sd")
DETAIL_TEXT_SIZE = 200
ENGINE_OFFSET = 3344
ENGINE_SLOTS = 4
_ENGINE = struct.Struct("<QIIBBB5xdd")
ENGINE_AWAKE, ENGINE_ASLEEP, ENGINE_PARTLY_AWAKE = 0, 1, 2
TAG_WEIGHTS, TAG_KV_CACHE = 1, 2
# the kinds of phase whose time is counted (their order is the layout: a new kind goes last);
# a phase of none of them (forward, optimizer_step, ...) counts as the kind it runs inside
PHASE_KINDS = ("step", "rollout", "generate", "reward", "weight_sync", "offload", "async_wait")
_KIND_OF = {name: PHASE_KINDS.index(kind) for name, kind in (
    ("step", "step"), ("rollout", "rollout"), ("generate", "generate"),
    ("rollout_server", "generate"), ("reward", "reward"), ("weight_sync", "weight_sync"),
    ("vllm_sleep", "offload"), ("vllm_wake_up", "offload"), ("async_wait", "async_wait"))}
_OFFLOAD = PHASE_KINDS.index("offload")   # and every offload_* / load_* phase
KINDS_OFFSET = 3760
_KINDS_AT = struct.Struct("<d")        # when the seconds were last counted
_KIND = struct.Struct("<Qd")           # entries, seconds innermost
CLAIM_OFFSET = 176
_CLAIM = struct.Struct("<B3xiii28s")
CLAIM_WORLD_SIZE = 28
# How a process's rank is known, weakest first: a launcher's variable at start (Slurm, Open MPI,
# PMIx, PMI, MVAPICH), RANK at start (torchrun, deepspeed, accelerate, a script's own), and the
# default process group the process created (every launcher, mp.spawn and Ray included).
# "vLLM engine", "SGLang engine": a process group a rollout engine created for itself (its
# workers' TP/PP world, stalldoc/engines): the process is an engine's worker, not a rank of the
# job (last: they outrank every other claim; each new engine's source is appended)
CLAIM_SOURCES = ("", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                 "MV2_COMM_WORLD_RANK", "RANK", "process group", *engines.CLAIM_SOURCES)
SOURCE_RANK = CLAIM_SOURCES.index("RANK")
SOURCE_GROUP = CLAIM_SOURCES.index("process group")
_HEARTBEAT_OFFSET = 32
_MARKER_OFFSET = 40
_STATUS_OFFSET = 6


def _encode(text: str, size: int) -> bytes:
    data = text.encode("utf-8", "replace")[: size - _TEXT_LEN.size]
    return _TEXT_LEN.pack(len(data)) + data


class StateWriter:
    """The agent's side: owns the mmap and writes fields in place."""

    def __init__(self, path: str, pid: int, rank: int, local_rank: int, world_size: int,
                 now: float) -> None:
        # made under another name and renamed once its header is in: a reader never finds the
        # file without it (a file of zeros is "not a state file" to the reader)
        making = path + ".new"
        fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # blocks reserved, not a sparse file: a full disk fails here (the agent stays off)
            # instead of killing the process with SIGBUS at its first write into the map
            os.posix_fallocate(fd, 0, SIZE)
            self.buf = mmap.mmap(fd, SIZE)
            _HEADER.pack_into(self.buf, 0, MAGIC, VERSION, STATUS_RUNNING, pid, rank, local_rank,
                              world_size, now, now, 0, now, -1)
            os.rename(making, path)
        except OSError:
            _unlink(making)
            raise
        finally:
            os.close(fd)
        self.path = path

    def identity(self, dump_signal: int, exe_dev: int, exe_ino: int, startup: float,
                 comm: bytes) -> None:
        _IDENTITY.pack_into(self.buf, IDENTITY_OFFSET, dump_signal, exe_dev, exe_ino, startup,
                            comm[:16])

    def claim(self, source: int, rank: int, local_rank: int, world_size: int,
              world: bytes) -> None:
        """How this process knows its rank (``CLAIM_SOURCES``), and that rank's world."""
        _CLAIM.pack_into(self.buf, CLAIM_OFFSET, source, rank, local_rank, world_size,
                         world[:CLAIM_WORLD_SIZE])

    def c10d(self, issued: int, rose_at: float, groups: int) -> None:
        """The collectives issued on the process groups (``agent/c10d_counters.py``)."""
        _C10D.pack_into(self.buf, C10D_OFFSET, issued, rose_at, groups)

    def heartbeat(self, now: float) -> None:
        _F64.pack_into(self.buf, _HEARTBEAT_OFFSET, now)

    def marker(self, seq: int, now: float) -> None:
        struct.pack_into("<Qd", self.buf, _MARKER_OFFSET, seq, now)

    def status(self, status: int, exit_code: int | None = None) -> None:
        struct.pack_into("<H", self.buf, _STATUS_OFFSET, status)
        if exit_code is not None:
            struct.pack_into("<i", self.buf, _HEADER.size - 4, exit_code)

    def phase_thread(self, native_id: int) -> None:
        """The thread that entered the innermost phase (0: none)."""
        _U32.pack_into(self.buf, PHASE_THREAD_OFFSET, native_id)

    def phase_stack(self, stack: list[str]) -> None:
        self.buf[PHASE_STACK_OFFSET : PHASE_STACK_OFFSET + PHASE_STACK_SIZE] = _encode(
            "/".join(stack), PHASE_STACK_SIZE).ljust(PHASE_STACK_SIZE, b"\0")

    def error(self, text: str) -> None:
        self.buf[ERROR_OFFSET : ERROR_OFFSET + ERROR_SIZE] = _encode(text, ERROR_SIZE).ljust(
            ERROR_SIZE, b"\0")

    def phase_done(self, count: int, name: str, started: float, ended: float) -> None:
        """Store completed phase number ``count`` (1-based) in the ring."""
        slot = (count - 1) % PHASE_SLOTS
        offset = PHASE_RING_OFFSET + _PHASE_COUNT.size + slot * _PHASE_ENTRY.size
        _PHASE_ENTRY.pack_into(self.buf, offset, name.encode()[:48], started, ended)
        _PHASE_COUNT.pack_into(self.buf, PHASE_RING_OFFSET, count)

    def phase_kind(self, kind: int, entries: int, seconds: float, counted_at: float) -> None:
        """Kind ``kind``'s entries and seconds, counted up to ``counted_at``."""
        _KIND.pack_into(self.buf, KINDS_OFFSET + _KINDS_AT.size + kind * _KIND.size, entries,
                        seconds)
        _KINDS_AT.pack_into(self.buf, KINDS_OFFSET, counted_at)

    def phase_detail(self, phase: str, since: float, detail: str) -> None:
        """The innermost phase with a detail ('' phase: none), since when, and its text."""
        _DETAIL_HEAD.pack_into(self.buf, DETAIL_OFFSET, phase.encode()[:48], since)
        start = DETAIL_OFFSET + _DETAIL_HEAD.size
        self.buf[start : start + DETAIL_TEXT_SIZE] = _encode(detail, DETAIL_TEXT_SIZE).ljust(
            DETAIL_TEXT_SIZE, b"\0")

    def engine(self, slot: int, key: int, sleeps: int, wakes: int, state: int, level: int,
               woken_tags: int, asleep_at: float, woken_at: float) -> None:
        """vLLM engine ``slot``'s sleep state."""
        _ENGINE.pack_into(self.buf, ENGINE_OFFSET + slot * _ENGINE.size, key, sleeps, wakes,
                          state, level, woken_tags, asleep_at, woken_at)

    def group_ring(self, slot: int, name: str) -> GroupRing:
        """Name group ``slot`` and return the writer of its collective ring."""
        offset = GROUP_OFFSET + slot * GROUP_SIZE
        _GROUP_HEADER.pack_into(self.buf, offset, name.encode()[:40])
        return GroupRing(self.buf, offset)

    def cuda(self, allocator: tuple[int, int, int, int, int] | None, sampled_at: float,
             host: int, gpu: int, host_label: str, gpu_label: str, gpu_done_at: float,
             oldest_pending_at: float) -> None:
        """Publish the CUDA block (the agent thread only)."""
        _CUDA.pack_into(self.buf, CUDA_OFFSET, 1, *(allocator or (-1,) * 5),
                        sampled_at if allocator else 0.0, host, gpu, gpu_done_at,
                        oldest_pending_at, host_label.encode()[:40], gpu_label.encode()[:40])

    def close(self) -> None:
        self.buf.close()


class GroupRing:
    """Writes one process group's collectives: the entry on enter, its completion time on return.
    One ``pack_into`` each way, since it runs inside every collective of the job."""

    __slots__ = ("buf", "base", "started")

    def __init__(self, buf: mmap.mmap, group_offset: int) -> None:
        self.buf = buf
        self.base = group_offset + GROUP_HEADER_SIZE   # offset of the ring's first entry
        self.started = 0

    def enter(self, op: bytes, numel: int, dtype: bytes, flags: int, now: float) -> int:
        """Record the start of the next collective; returns the offset of its entry."""
        seq = self.started = self.started + 1
        offset = self.base + ((seq - 1) & _RING_MASK) * _ENTRY_SIZE
        ENTRY.pack_into(self.buf, offset, seq, numel, now, 0.0, op, dtype, flags)
        return offset

    def exit(self, offset: int, now: float) -> None:
        """Record that the collective entered at ``offset`` returned."""
        _F64.pack_into(self.buf, offset + 24, now)


def phase_kind(name: str) -> int:
    """The index of ``name``'s kind in ``PHASE_KINDS``; -1 for a phase of none (offload_model,
    load_optimizer and the like are ``offload``)."""
    kind = _KIND_OF.get(name)
    if kind is None:
        return _OFFLOAD if name.startswith(("offload_", "load_")) else -1
    return kind


def entry_offset(slot: int, seq: int) -> int:
    """Byte offset of collective number ``seq`` (1-based) of group ``slot``."""
    return GROUP_OFFSET + slot * GROUP_SIZE + GROUP_HEADER_SIZE + ((seq - 1) % RING_SLOTS) * ENTRY.size


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


ENGINE_IDLE = "engine_idle"   # the phase of a vLLM engine core blocked waiting for requests
SERVED_PREFIX = "served-"     # served-<pid>.txt: the URL its process serves HTTP at


def served_path(directory: str, pid: int) -> str:
    """Where the agent of ``pid`` writes the URL its main thread serves HTTP at."""
    return os.path.join(directory, f"{SERVED_PREFIX}{pid}.txt")


REQUESTS_PREFIX = "requests-"   # requests-<pid>.txt: the HTTP requests its server holds
REQUESTS_RECORD = "{:>12} {:>12}\n"   # in flight, served so far: one record, rewritten in place


def requests_path(directory: str, pid: int) -> str:
    """Where the agent of ``pid`` keeps how many HTTP requests its server holds now and has
    taken so far (uvicorn's own counts, read each heartbeat)."""
    return os.path.join(directory, f"{REQUESTS_PREFIX}{pid}.txt")


PREEMPTED_PREFIX = "preempted-"   # preempted-<pid>.txt: requests its vLLM scheduler preempted


def preempted_path(directory: str, pid: int) -> str:
    """Where the agent of ``pid`` writes how many requests its vLLM scheduler has preempted
    (the engine core's process, or the rank's own when the engine runs in it)."""
    return os.path.join(directory, f"{PREEMPTED_PREFIX}{pid}.txt")


# the settings of a vLLM engine its agent records (agent/hooks.py) and a stall reads back
ENGINE_FIELDS = ("gpu_memory_utilization", "max_model_len", "tensor_parallel_size",
                 "enable_sleep_mode", "max_num_seqs", "enable_prefix_caching",
                 "distributed_executor_backend", "data_parallel_size")


def engine_settings_path(directory: str, pid: int) -> str:
    """Where the agent of ``pid`` writes the settings of each vLLM engine it creates (one JSON
    line per engine): in a rank itself when vLLM is colocated, else in vLLM's own process."""
    return os.path.join(directory, f"vllm-{pid}.json")


def state_path(directory: str, pid: int) -> str:
    """Where the agent of process ``pid`` keeps its state file."""
    return os.path.join(directory, f"agent-{pid}.state")


def finished_path(directory: str, pid: int) -> str:
    """Where the agent of process ``pid`` writes when the job's script returned (the time, as
    text): Python then waits for the job's threads that are not daemons, then runs its exit
    handlers, then ends the process."""
    return os.path.join(directory, f"finished-{pid}")


def read_finished(directory: str, pid: int) -> float | None:
    """When process ``pid``'s script returned; None when it has not (or wrote no time)."""
    try:
        with open(finished_path(directory, pid), "rb") as fh:
            return float(fh.read(32).decode("ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
