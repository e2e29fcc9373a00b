"""The sidecar's link to the relay: the records the relay sends (the job's output, its options,
the job's pid, reaped statuses, the end) read on a thread of their own, and the messages
the watcher sends back."""
from __future__ import annotations

import json
import os
import select
import sys
import threading
import time
from typing import Callable

from stalldoc.run.channel import LineSplitter, RecordReader, RelayRecord, encode_message
from stalldoc.run.terminal import write_all
from stalldoc.model.samples import LogLine

READ_BYTES = 1 << 20


class RelayLink:
    """The sidecar's end of the two pipes: a reader thread decodes the relay's records."""

    def __init__(self, in_fd: int, out_fd: int, streams: list[tuple[int, int]]) -> None:
        self.in_fd, self.out_fd = in_fd, out_fd
        self.streams = streams      # the job's output (read ends) and where it goes
        self.options_ready = threading.Event()
        self.job_started = threading.Event()
        self.options: dict[str, object] = {}
        self.job_pid = 0
        self.job_started_at = 0.0
        self.job_code: int | None = None
        self.job_ended = threading.Event()    # set when the relay says the job ended
        self.watch_code: int | None = None    # what `stalldoc watch` exits with, the relay says
        self.ended_by = "job"                 # job / stalldoc / interrupt, the relay says
        self.dropped = 0
        self.ending = False
        self.interrupted_at: float | None = None   # the user's SIGINT reached the job then
        self.relay_gone = False
        self.reaped: dict[int, int] = {}      # pid -> raw wait status, as the relay reaped it
        self.on_line: Callable[[LogLine], None] | None = None
        self._splitters = {"stdout": LineSplitter(), "stderr": LineSplitter()}
        self._send_lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="stalldoc-relay", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        reader = RecordReader()
        while True:
            try:
                chunk = os.read(self.in_fd, READ_BYTES)
            except OSError:
                chunk = b""
            if not chunk:
                break
            for record in reader.feed(chunk):
                self._record(record)
        self.relay_gone = True
        self.options_ready.set()
        self.job_started.set()
        if self.job_pid and self.job_code is None:
            self.take_over_output()

    def take_over_output(self) -> None:
        """The relay was killed while the job runs: copy its output on ourselves, so it never
        writes into a pipe nobody reads (EPIPE) or a full one (blocked)."""
        targets = {source: target for source, target in self.streams}
        if not targets:
            return
        write_all(targets[self.streams[-1][0]],
                  b"[stalldoc] the relay was killed; the sidecar relays the job's output now "
                  b"(the job's exit code will not reach the shell)\n")
        while targets:
            for source in select.select(list(targets), [], [], 1.0)[0]:
                try:
                    data = os.read(source, 65536)
                except OSError:
                    data = b""
                if not data:
                    del targets[source]
                    continue
                write_all(targets[source], data)
                stream = "stdout" if source == self.streams[0][0] else "stderr"
                self._output(stream, time.time(), data)

    def _output(self, stream: str, t: float, data: bytes) -> None:
        """Cut a chunk of the job's output into lines for the watcher."""
        for line in self._splitters[stream].feed(data):
            if self.on_line is not None:
                self.on_line(LogLine(t, stream, line.decode("utf-8", "replace")))

    def _record(self, record: RelayRecord) -> None:
        kind, fields = record.kind, record.fields
        if kind == "C":
            self._output(fields[0], float(fields[1]), record.payload)
        elif kind == "G":
            self._splitters[fields[0]] = LineSplitter()   # the open line lost its middle
        elif kind == "Z":
            self._output(fields[0], time.time(), b"\n")   # its last line, even without an end
        elif kind == "O":
            self.options = json.loads(fields[0])
            self.options_ready.set()
        elif kind == "J":
            self.job_pid, self.job_started_at = int(fields[0]), float(fields[1])
            self.job_started.set()
        elif kind == "X":
            self.reaped[int(fields[0])] = int(fields[1])
        elif kind == "T":
            self.ending = True
        elif kind == "I":
            self.interrupted_at = time.time()
        elif kind == "E":
            self.dropped = int(fields[1])
            if len(fields) >= 4:
                self.watch_code, self.ended_by = int(fields[2]), fields[3]
            self.job_code = int(fields[0])
            self.job_ended.set()

    def send(self, **message: object) -> None:
        """A message for the relay; when the relay is gone, it goes to our log instead."""
        data = encode_message(**message)
        with self._send_lock:
            try:
                os.write(self.out_fd, data)
                return
            except OSError:
                self.relay_gone = True
        if "say" in message:
            sys.stderr.write(f"[stalldoc] {message['say']}\n")
            sys.stderr.flush()
