"""The job's output as the watcher sees it: lines handed over by the relay, drained once a tick
into the store, the rules' unread batch, a tail for the diagnosis, launcher exit reports and the
job's own progress lines. Every line is redacted as it is drained, before anything else sees it,
and loses the terminal's escape sequences (Ray colours its prefixes: ``\x1b[33m(autoscaler +5s)
\x1b[0m Error: ...``), which the terminal still gets from the relay; a report shows the words."""
from __future__ import annotations

import queue
import re
from collections import deque
from dataclasses import dataclass, field

from stalldoc.detect.progress_lines import ProgressLines
from stalldoc.detect.raised_lines import RaisedLines
from stalldoc.model.samples import LogLine
from stalldoc.probes.exits import parse_launcher_line
from stalldoc.redact import LineRedactor

TAIL_LINES = 200
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")   # CSI: colours, cursor moves, erasing
QUEUE_LINES = 50_000   # lines waiting for the next tick; past this they are counted, not kept


@dataclass(frozen=True)
class Drained:
    """What one drain found: the new lines, when the newest progress line was printed, and
    when the newest counted step line was (``ProgressLines.is_counted``)."""

    lines: list[LogLine]
    progress_at: float | None
    counted_at: float | None = None


@dataclass
class LogFeed:
    lines: "queue.SimpleQueue[LogLine]" = field(default_factory=queue.SimpleQueue)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    unread: list[LogLine] = field(default_factory=list)     # not yet seen by the tick rules
    launcher_codes: dict[int, int] = field(default_factory=dict)   # pid -> Popen returncode
    progress: ProgressLines = field(default_factory=ProgressLines)
    raised: RaisedLines = field(default_factory=RaisedLines)   # the exception printed last
    dropped: int = 0
    redactors: dict[str, LineRedactor] = field(default_factory=dict)   # per stream: key blocks

    def put(self, line: LogLine) -> None:
        """Called by the thread reading the relay: never blocks, and holds at most
        ``QUEUE_LINES`` lines (a burst of output must not grow the sidecar without bound)."""
        if self.lines.qsize() >= QUEUE_LINES:
            self.dropped += 1
            return
        self.lines.put(line)

    def drain(self) -> Drained:
        batch: list[LogLine] = []
        progress_at = counted_at = None
        while True:
            try:
                line = self._redacted(self.lines.get_nowait())
            except queue.Empty:
                return Drained(batch, progress_at, counted_at)
            batch.append(line)
            self.raised.feed((line,))
            self.tail.append(line.text)
            self.unread.append(line)
            if self.progress.is_progress(line.text):
                progress_at = line.t
            if self.progress.is_counted(line.text):
                counted_at = line.t
            parsed = parse_launcher_line(line.text)
            if parsed:
                self.launcher_codes[parsed[0]] = parsed[1]

    def take_unread(self) -> tuple[LogLine, ...]:
        unread, self.unread = tuple(self.unread), []
        return unread

    def _redacted(self, line: LogLine) -> LogLine:
        redactor = self.redactors.get(line.stream)
        if redactor is None:
            redactor = self.redactors[line.stream] = LineRedactor()
        plain = _ESCAPES.sub("", line.text) if "\x1b" in line.text else line.text
        text = redactor.line(plain)
        return line if text is line.text else LogLine(line.t, line.stream, text)
