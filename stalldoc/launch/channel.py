"""The two pipes between the relay (the process the shell waits on) and the sidecar (analysis).

Relay → sidecar, one record per line, written without ever blocking the relay:
  ``O <json>``                 the watch options (first record)
  ``J <pid> <started_at>``     the job started
  ``L<o|e> <t> <bytes>``       a line the job printed (may be dropped when the sidecar lags)
  ``X <pid> <wait status>``    a process the relay reaped (orphaned ranks end under the relay)
  ``T``                        the relay is ending the job (its ranks' deaths are not findings)
  ``E <code> <dropped>``       the job exited with ``code``; ``dropped`` lines were not handed on

Sidecar → relay, one JSON object per line: ``{"say": text}``, ``{"status": text}``,
``{"launch": bool, "why": text, "code": int}``, ``{"end_job": reason}``.
"""
from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass

OUTBOX_LIMIT = 8 << 20     # bytes of log lines the relay holds for a slow sidecar, then drops
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


def line_records(stream: str, t: float, lines: list[bytes]) -> bytes:
    head = b"L" + stream[0].encode() + b" %.6f " % t
    return b"".join(head + line + b"\n" for line in lines)


class Outbox:
    """The relay's end of the relay → sidecar pipe: non-blocking, bounded. Control records are
    always kept; log lines past ``OUTBOX_LIMIT`` bytes waiting are dropped and counted."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._queue: deque[bytes] = deque()
        self._size = 0
        self.dropped = 0
        self.broken = False

    def control(self, record: str) -> None:
        self._push(record.encode() + b"\n")
        self.flush()

    def lines(self, stream: str, t: float, lines: list[bytes]) -> None:
        if not lines or self.broken:
            return
        if self._size > OUTBOX_LIMIT:
            self.dropped += len(lines)
            return
        self._push(line_records(stream, t, lines))

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
                self._size = 0
                return
            self._size -= written
            if written == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[written:]

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = -1   # never close a number the process may have reused
        self.broken = True
        self._queue.clear()


@dataclass(frozen=True)
class RelayRecord:
    """One record from the relay, decoded."""

    kind: str                 # O J L X T E
    fields: tuple[str, ...]
    text: str = ""            # L: the line


def parse_relay_record(raw: bytes) -> RelayRecord | None:
    """Decode one line from the relay; None for anything malformed."""
    if not raw:
        return None
    kind = chr(raw[0])
    try:
        if kind == "L":
            stream = "stdout" if raw[1:2] == b"o" else "stderr"
            stamp, _, text = raw[3:].partition(b" ")
            return RelayRecord("L", (stream, stamp.decode()), text.decode("utf-8", "replace"))
        if kind == "O":
            return RelayRecord("O", (raw[2:].decode(),))
        return RelayRecord(kind, tuple(raw[2:].decode().split()))
    except (UnicodeDecodeError, IndexError):
        return None


def encode_message(**message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"
