"""The two pipes between the relay (the process the shell waits on) and the sidecar (analysis).

Relay → sidecar, written without ever blocking the relay. Control records are one line each:
  ``O <json>``                 the watch options (first record)
  ``J <pid> <started_at>``     the job started
  ``X <pid> <wait status>``    a process the relay reaped (orphaned ranks end under the relay)
  ``T``                        the relay is ending the job (its ranks' deaths are not findings)
  ``I``                        the user interrupted the job: SIGINT reached the relay and went
                               on to the job (what ends in the next minute is the user's doing)
  ``G<o|e>``                   output of that stream was dropped just before the next chunk
  ``Z<o|e>``                   that stream ended
  ``E <code> <dropped> <watch code> <ended by>``  the job exited with ``code``; ``dropped``
                               lines were not handed on; ``stalldoc watch`` exits with ``watch
                               code``; who ended the job: ``job`` (itself), ``stalldoc``
                               (``--on-stall kill``) or ``interrupt`` (SIGINT / SIGTERM to watch)
Output goes as raw chunks, ``C<o|e> <t> <n>`` and a newline, then ``n`` bytes: the relay does a
constant amount of work per chunk whatever the lines in it; the sidecar cuts the lines.

Sidecar → relay, one JSON object per line: ``{"say": text}``, ``{"status": text}``,
``{"launch": bool, "why": text}``, ``{"rank_pid": pid}``, ``{"end_job": reason}``.
"""
from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass

OUTBOX_LIMIT = 8 << 20     # bytes of output the relay holds for a slow sidecar, then lets go
BATCH_SECONDS = 0.05       # output is handed over in batches: at most this old...
BATCH_BYTES = 256 << 10    # ...or this large
LINE_LIMIT = 16 << 10      # a log line longer than this is cut (the job's output is not)


class LineSplitter:
    """Cuts one output stream into lines in linear time: each chunk is split once, and a line
    still open is kept only up to ``LINE_LIMIT`` bytes (the rest of it is not kept)."""

    def __init__(self) -> None:
        self._open = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        parts = chunk.replace(b"\r", b"\n").split(b"\n")
        parts[0] = self._open + parts[0][: max(0, LINE_LIMIT - len(self._open))]
        self._open = parts.pop()[:LINE_LIMIT]
        return [part[:LINE_LIMIT] for part in parts if part]

    def close(self) -> list[bytes]:
        rest, self._open = self._open, b""
        return [rest] if rest else []


class Outbox:
    """The relay's end of the relay → sidecar pipe: non-blocking, bounded, batched. Output is
    gathered per stream and handed over every ``BATCH_SECONDS`` (one record, one write, however
    many small writes the job made). Control records are always kept, in order after the output
    before them. Past ``OUTBOX_LIMIT`` bytes waiting, the oldest waiting output goes (a gap
    record in its place, its lines counted): the newest lines, the last words before a hang, are
    the ones a diagnosis needs; only output that cannot fit even so is dropped as it comes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._queue: deque[bytes] = deque()
        self._size = 0
        self.dropped = 0
        self.broken = False
        self._gap: set[bytes] = set()
        self._batch: dict[bytes, tuple[float, bytearray]] = {}
        self._batch_size = 0
        self.batch_since = 0.0
        self._head_partial = False    # the queue's head is half written: it must go on whole

    def control(self, record: str) -> None:
        self.pack()
        self._push(record.encode() + b"\n")
        self.flush()

    def chunk(self, stream: str, t: float, data: bytes) -> None:
        """A chunk of the job's output (``stream`` is stdout or stderr)."""
        if self.broken:
            return
        tag = b"o" if stream == "stdout" else b"e"
        if self._size + self._batch_size + len(data) > OUTBOX_LIMIT:
            self._make_room(len(data))
        if self._size + self._batch_size > OUTBOX_LIMIT:
            self.dropped += data.count(b"\n") or 1
            self._gap.add(tag)
            return
        if tag in self._gap:
            self.pack()
            self._gap.discard(tag)
            self._push(b"G" + tag + b"\n")
        if not self._batch:
            self.batch_since = t
        entry = self._batch.get(tag)
        if entry is None:
            self._batch[tag] = (t, bytearray(data))
        else:
            entry[1].extend(data)
        self._batch_size += len(data)
        if self._batch_size >= BATCH_BYTES:
            self.pack()

    def due(self, now: float) -> float | None:
        """Seconds until the batch must go (0: now); None without a batch."""
        if not self._batch:
            return None
        return max(0.0, self.batch_since + BATCH_SECONDS - now)

    def pack(self) -> None:
        """Move the batch into the queue (one record per stream) and write what the pipe takes."""
        for tag, (t, data) in self._batch.items():
            self._push(b"C%s %.6f %d\n" % (tag, t, len(data)) + bytes(data))
        self._batch.clear()
        self._batch_size = 0
        self.flush()

    def _make_room(self, need: int) -> None:
        """Let the oldest waiting output records go, each replaced by a gap record of its
        stream, until ``need`` more bytes fit (or no output is left to let go)."""
        excess = self._size + self._batch_size + need - OUTBOX_LIMIT
        kept: deque[bytes] = deque()
        for i, entry in enumerate(self._queue):
            if excess <= 0 or entry[:1] != b"C" or (i == 0 and self._head_partial):
                kept.append(entry)
                continue
            self.dropped += entry.count(b"\n") - 1 or 1
            gap = b"G" + entry[1:2] + b"\n"
            if kept and kept[-1] == gap:     # one gap record stands for a run of them
                freed = len(entry)
            else:
                kept.append(gap)
                freed = len(entry) - len(gap)
            self._size -= freed
            excess -= freed
        self._queue = kept

    def _push(self, data: bytes) -> None:
        if not self.broken:
            self._queue.append(data)
            self._size += len(data)

    @property
    def waiting(self) -> bool:
        return bool(self._queue) and not self.broken

    def flush(self) -> None:
        """Write what the pipe takes now; never blocks."""
        while self._queue and not self.broken:
            head = self._queue[0]
            try:
                written = os.write(self.fd, head)
            except BlockingIOError:
                return
            except OSError:   # the sidecar is gone
                self.broken = True
                self._queue.clear()
                self._batch.clear()
                self._size = self._batch_size = 0
                return
            self._size -= written
            if written == len(head):
                self._queue.popleft()
                self._head_partial = False
            else:
                self._queue[0] = head[written:]
                self._head_partial = True

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = -1   # never close a number the process may have reused
        self.broken = True
        self._queue.clear()
        self._batch.clear()


@dataclass(frozen=True)
class RelayRecord:
    """One record from the relay, decoded."""

    kind: str                     # O J X T G Z E C
    fields: tuple[str, ...]
    payload: bytes = b""          # C: the chunk of output


class RecordReader:
    """Decodes the relay's byte stream into records, however the reads cut it."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[RelayRecord]:
        self._buffer += data
        out: list[RelayRecord] = []
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end < 0:
                break
            header = bytes(self._buffer[start:end])
            if header[:1] == b"C":
                parts = header[3:].split()
                size = int(parts[1]) if len(parts) == 2 else 0
                if len(self._buffer) < end + 1 + size:
                    break   # the rest of the chunk is still to come
                payload = bytes(self._buffer[end + 1:end + 1 + size])
                out.append(RelayRecord("C", (_stream(header[1:2]), parts[0].decode()), payload))
                start = end + 1 + size
                continue
            record = _control(header)
            if record is not None:
                out.append(record)
            start = end + 1
        del self._buffer[:start]
        return out


def _stream(tag: bytes) -> str:
    return "stdout" if tag == b"o" else "stderr"


def _control(header: bytes) -> RelayRecord | None:
    if not header:
        return None
    kind = chr(header[0])
    try:
        if kind == "O":
            return RelayRecord("O", (header[2:].decode(),))
        if kind in "GZ":
            return RelayRecord(kind, (_stream(header[1:2]),))
        return RelayRecord(kind, tuple(header[2:].decode().split()))
    except UnicodeDecodeError:
        return None


def encode_message(**message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"
