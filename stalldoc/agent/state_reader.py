"""The watcher's side of the state file: decode an agent's state into frozen records.

The layout and the writer live in ``statefile.py`` (imported by every process of the job, so it
stays small); this module is imported by the sidecar only.
"""
from __future__ import annotations

import errno
import math
import os
import stat
from dataclasses import dataclass

from stalldoc.agent.statefile import (C10D_OFFSET, CLAIM_OFFSET, CLAIM_SOURCES, KINDS_OFFSET,
                                      PHASE_KINDS, PHASE_THREAD_OFFSET, _C10D, _CLAIM, _KIND,
                                      _KINDS_AT, _U32)
from stalldoc.agent.statefile import (CUDA_OFFSET, DETAIL_OFFSET, DETAIL_TEXT_SIZE, ENGINE_ASLEEP,
                                      ENGINE_OFFSET, ENGINE_PARTLY_AWAKE, ENGINE_SLOTS, ENTRY,
                                      ERROR_OFFSET, ERROR_SIZE, FLAG_ASYNC, GROUP_HEADER_SIZE,
                                      GROUP_OFFSET, GROUP_SIZE, GROUP_SLOTS, IDENTITY_OFFSET, MAGIC,
                                      PHASE_RING_OFFSET, PHASE_SLOTS, PHASE_STACK_OFFSET,
                                      PHASE_STACK_SIZE, READABLE_VERSIONS, RING_SLOTS, SIZE,
                                      TAG_KV_CACHE, TAG_WEIGHTS, VERSION, _CUDA, _DETAIL_HEAD,
                                      _ENGINE, _GROUP_HEADER, _HEADER, _IDENTITY, _PHASE_COUNT,
                                      _PHASE_ENTRY, _TEXT_LEN)
# The records live in model.py (a leaf: it imports nothing of stalldoc); re-exported here.
from stalldoc.model.agent import AgentIdentity as AgentIdentity
from stalldoc.model.agent import AgentSnapshot as AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord as CollectiveRecord
from stalldoc.model.agent import CudaState as CudaState
from stalldoc.model.agent import EngineSleepState as EngineSleepState
from stalldoc.model.collectives import GroupState as GroupState
from stalldoc.model.agent import PhaseDetail as PhaseDetail
from stalldoc.model.agent import PhaseKinds as PhaseKinds
from stalldoc.model.agent import PhaseRecord as PhaseRecord
from stalldoc.model.ranks import RankClaim

# What an agent can write. A value beyond these is not an agent's (a crafted or damaged file):
# the whole file is refused, so no such number reaches SQLite (int64) or the detector.
MAX_COUNT = 2**53          # markers, collectives, phases, elements: never reached in a run
MAX_SECONDS = 1e11         # times (seconds since the epoch, or durations): finite, before 5138


class StateFileError(Exception):
    """The file is not a state file this version can read."""


def _decode_text(buf: bytes, offset: int, size: int) -> str:
    """The text in the region of ``size`` bytes at ``offset`` (a longer length is cut to it)."""
    (length,) = _TEXT_LEN.unpack_from(buf, offset)
    start = offset + _TEXT_LEN.size
    return buf[start : start + min(length, size - _TEXT_LEN.size)].decode("utf-8", "replace")


def _count(what: str, value: int) -> int:
    if not 0 <= value <= MAX_COUNT:
        raise StateFileError(f"{what} out of range: {value}")
    return value


def _seconds(what: str, value: float) -> float:
    if not (math.isfinite(value) and abs(value) <= MAX_SECONDS):
        raise StateFileError(f"{what} out of range: {value!r}")
    return value


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


_SEQ_STRIDE = ENTRY.size // 8          # an entry's sequence number is its first 8-byte word
_RING_BYTES = RING_SLOTS * ENTRY.size


@dataclass(frozen=True)
class RingCursor:
    """What a reader has read of one group's ring: the newest sequence number, how many it
    never read (``GroupState.wrapped``), and the group's state then."""

    newest: int
    wrapped: int
    state: GroupState


def _record(buf: bytes, offset: int, name: str) -> CollectiveRecord:
    seq, numel, t0, t1, op, dtype, flags = ENTRY.unpack_from(buf, offset)
    return CollectiveRecord(name, seq, _cstr(op), _count("numel", numel), _cstr(dtype),
                            _seconds("collective entered", t0),
                            _seconds("collective completed", t1) if t1 > 0.0 else None,
                            bool(flags & FLAG_ASYNC))


def _read_group(buf: bytes, slot: int, before: RingCursor | None = None,
                first: bool = True) -> RingCursor | None:
    """Group ``slot``'s ring, decoding only the entries ``before`` has not read (new ones, and
    pending ones, which may have completed since). ``first``: the reader never read this file
    before, so what the ring lost until now is not counted as wrapped (the watcher was not
    looking); a group that appears later is counted from its first collective."""
    offset = GROUP_OFFSET + slot * GROUP_SIZE
    name = _cstr(_GROUP_HEADER.unpack_from(buf, offset)[0])
    if not name:
        return None
    base = offset + GROUP_HEADER_SIZE
    seqs = memoryview(buf)[base : base + _RING_BYTES].cast("Q")[::_SEQ_STRIDE].tolist()
    newest = _count("collective sequence", max(seqs))
    floor = max(0, newest - RING_SLOTS)      # this and older numbers are overwritten
    if before is None or before.state.name != name or before.newest > newest:
        before = RingCursor(floor if first else 0, 0, GroupState(name, 0, 0, ()))
    last, mask = before.newest, RING_SLOTS - 1
    # collective q sits at entry (q - 1) & mask; an entry overwritten, or torn by a concurrent
    # write, holds another number and is not read
    kept = {r.seq: r for r in before.state.ring if seqs[(r.seq - 1) & mask] == r.seq}
    new = [q for q in range(max(last, floor) + 1, newest + 1) if seqs[(q - 1) & mask] == q]
    records = {q: _record(buf, base + ((q - 1) & mask) * ENTRY.size, name)
               for q in (*new, *(q for q, r in kept.items() if not r.completed))}
    fresh = len(new)
    wrapped = before.wrapped + (newest - last) - fresh if newest > last else before.wrapped
    ring = tuple(r for _, r in sorted({**kept, **records}.items()))
    in_flight = sum(1 for record in ring if not record.completed)
    return RingCursor(max(newest, last), wrapped,
                      GroupState(name, newest, newest - in_flight, ring, wrapped))


def _read_phases(buf: bytes) -> tuple[int, tuple[PhaseRecord, ...]]:
    count = _count("phase count", _PHASE_COUNT.unpack_from(buf, PHASE_RING_OFFSET)[0])
    records = []
    for n in range(max(1, count - PHASE_SLOTS + 1), count + 1):
        offset = PHASE_RING_OFFSET + _PHASE_COUNT.size + ((n - 1) % PHASE_SLOTS) * _PHASE_ENTRY.size
        name, t0, t1 = _PHASE_ENTRY.unpack_from(buf, offset)
        records.append(PhaseRecord(_cstr(name), _seconds("phase start", t0),
                                   _seconds("phase end", t1)))
    return count, tuple(records)


def _read_kinds(buf: bytes) -> PhaseKinds | None:
    counted_at = _KINDS_AT.unpack_from(buf, KINDS_OFFSET)[0]
    if counted_at == 0.0:
        return None     # no phase of a kind yet, or an agent that does not count them
    rows = [_KIND.unpack_from(buf, KINDS_OFFSET + _KINDS_AT.size + i * _KIND.size)
            for i in range(len(PHASE_KINDS))]
    return PhaseKinds(_seconds("phase kinds counted", counted_at),
                      tuple((k, _count("phase entries", n)) for k, (n, _) in zip(PHASE_KINDS, rows)),
                      tuple((k, _seconds("phase seconds", t)) for k, (_, t) in zip(PHASE_KINDS, rows)))


def _read_cuda(buf: bytes) -> CudaState | None:
    (active, allocated, reserved, peak, retries, ooms, sampled_at, host, gpu, gpu_at, oldest,
     host_label, gpu_label) = _CUDA.unpack_from(buf, CUDA_OFFSET)
    if not active:
        return None
    figures = [None if v < 0 else v for v in (allocated, reserved, peak, retries, ooms)]
    return CudaState(*figures, _seconds("CUDA sampled", sampled_at), _count("host marker", host),
                     _count("GPU marker", gpu), _cstr(host_label), _cstr(gpu_label),
                     _seconds("GPU done", gpu_at), _seconds("oldest pending", oldest))


def _read_detail(buf: bytes) -> PhaseDetail | None:
    name, since = _DETAIL_HEAD.unpack_from(buf, DETAIL_OFFSET)
    phase = _cstr(name)
    if not phase:
        return None
    text = _decode_text(buf, DETAIL_OFFSET + _DETAIL_HEAD.size, DETAIL_TEXT_SIZE)
    method, _, rest = text.partition("\t")
    mode, _, endpoint = rest.partition("\t")
    return PhaseDetail(phase, method, mode, endpoint, _seconds("phase detail since", since))


_ENGINE_STATES = {ENGINE_ASLEEP: "asleep", ENGINE_PARTLY_AWAKE: "partly awake"}


def _read_engines(buf: bytes) -> tuple[EngineSleepState, ...]:
    engines = []
    for slot in range(ENGINE_SLOTS):
        (key, sleeps, wakes, state, level, tags, asleep_at,
         woken_at) = _ENGINE.unpack_from(buf, ENGINE_OFFSET + slot * _ENGINE.size)
        if not key:
            continue
        woken = tuple(n for bit, n in ((TAG_WEIGHTS, "weights"), (TAG_KV_CACHE, "kv_cache"))
                      if tags & bit)
        engines.append(EngineSleepState(
            f"engine {slot + 1}", _ENGINE_STATES.get(state, "awake"),
            _seconds("asleep at", asleep_at) or None, _seconds("woken at", woken_at) or None,
            level, sleeps, wakes, woken))
    return tuple(engines)


def _read_c10d(buf: bytes) -> tuple[int, float]:
    """(collectives issued on the process groups, when that last rose); zeros when unwritten."""
    issued, rose_at, _groups = _C10D.unpack_from(buf, C10D_OFFSET)
    return _count("c10d collectives", issued), _seconds("c10d rose at", rose_at)


def parse_state(buf: bytes, rings: RingReader | None = None) -> AgentSnapshot:
    """Decode a state file's bytes; raises StateFileError for a foreign, newer or damaged file
    (a number no agent writes). ``rings``: the reader's cursors of this file's rings, for an
    incremental read (updated only when the whole file decodes)."""
    if len(buf) < SIZE:
        raise StateFileError(f"state file is {len(buf)} bytes, expected {SIZE}")
    (magic, version, status, pid, rank, local_rank, world, started, heartbeat, marker_seq,
     marker_at, exit_code) = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise StateFileError("not a stalldoc state file (bad magic)")
    if version not in READABLE_VERSIONS:
        raise StateFileError(f"state file version {version}; this stalldoc reads "
                             f"{', '.join(map(str, READABLE_VERSIONS))} (writes {VERSION})")
    stack_text = _decode_text(buf, PHASE_STACK_OFFSET, PHASE_STACK_SIZE)
    count, phases = _read_phases(buf)
    cursors = [_read_group(buf, s, *(rings.before(s) if rings else (None, True)))
               for s in range(GROUP_SLOTS)]
    groups = tuple(c.state for c in cursors if c is not None)
    cuda = _read_cuda(buf)
    signum, dev, ino, startup, comm = _IDENTITY.unpack_from(buf, IDENTITY_OFFSET)
    identity = AgentIdentity(signum, dev, ino, _seconds("start-up", startup), _cstr(comm))
    c10d_issued, c10d_rose_at = _read_c10d(buf)
    snapshot = AgentSnapshot(pid, rank, local_rank, world, status, _seconds("start", started),
                             _seconds("heartbeat", heartbeat),
                             _count("marker sequence", marker_seq),
                             _seconds("last marker", marker_at),
                             exit_code if exit_code >= 0 else None,
                             tuple(p for p in stack_text.split("/") if p),
                             _decode_text(buf, ERROR_OFFSET, ERROR_SIZE), count, phases, groups,
                             cuda, identity,
                             *((_read_detail(buf), _read_engines(buf)) if version >= 4
                               else (None, ())),
                             c10d_issued=c10d_issued, c10d_rose_at=c10d_rose_at,
                             phase_thread=_U32.unpack_from(buf, PHASE_THREAD_OFFSET)[0],
                             kinds=_read_kinds(buf))
    if rings is not None:
        rings.advance(cursors)
    return snapshot


class RingReader:
    """One state file's collective rings read incrementally, tick after tick: each read decodes
    only the entries added since the last one (and re-reads pending ones), and counts exactly the
    collectives that were overwritten before they could be read (``GroupState.wrapped``)."""

    def __init__(self) -> None:
        self._cursors: list[RingCursor | None] = [None] * GROUP_SLOTS
        self._first = True

    def before(self, slot: int) -> tuple[RingCursor | None, bool]:
        return self._cursors[slot], self._first

    def advance(self, cursors: list[RingCursor | None]) -> None:
        self._cursors, self._first = cursors, False


class IncrementalReader:
    """State files read tick after tick, each with its rings' cursors (kept per file and the
    agent that wrote it: a pid reused by a new agent starts afresh)."""

    def __init__(self) -> None:
        self._rings: dict[str, tuple[float, int, RingReader]] = {}

    def read(self, path: str) -> AgentSnapshot:
        buf = _read_file(path, SIZE)
        if len(buf) < _HEADER.size:
            return parse_state(buf)
        head = _HEADER.unpack_from(buf, 0)
        key = (head[7], head[3])    # the agent's start time and pid
        known = self._rings.get(path)
        if known is None or known[:2] != key:
            known = self._rings[path] = (*key, RingReader())
        return parse_state(buf, known[2])

    def keep_only(self, paths: set[str]) -> None:
        """Forget the files not in ``paths`` (their ranks ended or left)."""
        for path in set(self._rings) - paths:
            del self._rings[path]


def read_state(path: str) -> AgentSnapshot:
    """Read and decode one state file."""
    return parse_state(_read_file(path, SIZE))


def read_claim(path: str) -> RankClaim | None:
    """The rank the agent of ``path`` claims for its process (``agent/identity.py``); None when it
    claims none. Raises StateFileError for a file that is not an agent's, OSError when absent."""
    buf = _read_file(path, CLAIM_OFFSET + _CLAIM.size)
    if len(buf) < CLAIM_OFFSET + _CLAIM.size:
        raise StateFileError("state file too short for its rank claim")
    magic, version = _HEADER.unpack_from(buf, 0)[:2]
    if magic != MAGIC or version not in READABLE_VERSIONS:
        raise StateFileError("not a state file this stalldoc reads")
    source, rank, local_rank, world_size, world = _CLAIM.unpack_from(buf, CLAIM_OFFSET)
    if not source:
        return None
    if source >= len(CLAIM_SOURCES) or not 0 <= rank < 2**31:
        raise StateFileError(f"rank claim out of range: source {source}, rank {rank}")
    return RankClaim(CLAIM_SOURCES[source], rank, local_rank if local_rank >= 0 else None,
                     world_size if world_size > 0 else None, _cstr(world))


def _header(path: str) -> tuple | None:
    """The header's fields of the state file at ``path``; None when unreadable or short."""
    try:
        head = _read_file(path, _HEADER.size)
    except (OSError, StateFileError):
        return None
    return _HEADER.unpack(head) if len(head) >= _HEADER.size else None


def read_started_at(path: str) -> float | None:
    """When the agent that owns ``path`` started (its header only); None when unreadable."""
    fields = _header(path)
    if fields is None:
        return None
    started = fields[7]
    return started if fields[0] == MAGIC and math.isfinite(started) else None


def read_markers(path: str) -> int | None:
    """How many progress markers the agent of ``path`` has counted (its header only); None
    when unreadable or not an agent's file."""
    fields = _header(path)
    if fields is None or fields[0] != MAGIC or fields[1] not in READABLE_VERSIONS:
        return None
    return fields[9]


def _read_file(path: str, size: int) -> bytes:
    """The first ``size`` bytes of the state file at ``path``: a regular file of the state
    file's size, not a link, never waiting (a FIFO named like a state file is refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):   # a link, a socket
            raise StateFileError(f"not a regular file ({exc.strerror})") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateFileError("not a regular file")
        if info.st_size != SIZE:
            raise StateFileError(f"state file is {info.st_size} bytes, expected {SIZE}")
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
