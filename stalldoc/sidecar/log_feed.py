"""The job's output as the watcher sees it: lines handed over by the relay, drained once a tick
into the store, the rules' unread batch, a tail for the diagnosis, launcher exit reports and the
job's own progress lines. Every line is redacted as it is drained, before anything else sees it,
and loses the terminal's escape sequences (Ray colours its prefixes: ``\x1b[33m(autoscaler +5s)
\x1b[0m Error: ...``), which the terminal still gets from the relay; a report shows the words.

A job that floods its output (vLLM logs each weight reload; a warning printed in a loop) must not
take the watcher's ticks: a tick reads lines for a bounded time (``Drained.left`` say how many
wait for the next), and the queue keeps the newest ``QUEUE_LINES`` lines, counting the older
ones it lets go (the last words before a hang are the ones a diagnosis needs)."""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field

from stalldoc.detect.cluster_wait import unplaceable
from stalldoc.detect.progress_lines import ProgressLines
from stalldoc.detect.raised_lines import RaisedLines
from stalldoc.model.samples import LogLine, words_of
from stalldoc.probes.exits import parse_launcher_line
from stalldoc.redact import LineRedactor

TAIL_LINES = 200
QUEUE_LINES = 50_000   # lines waiting for the next tick; past this the oldest are counted, not kept
CLOCK_EVERY = 256      # lines drained between two looks at the clock


@dataclass(frozen=True)
class Drained:
    """What one drain found: the new lines, when the newest progress line was printed, when
    the newest counted step line was (``ProgressLines.is_counted``), and when Ray last said no
    node type of the cluster can hold a request of the job (``detect/cluster_wait.py``)."""

    lines: list[LogLine]
    progress_at: float | None
    counted_at: float | None = None
    left: int = 0      # lines still queued when the tick's time for them ran out
    unplaceable_at: float | None = None   # the newest line saying no node type can hold one


@dataclass
class LogFeed:
    lines: deque[LogLine] = field(default_factory=lambda: deque(maxlen=QUEUE_LINES))
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    unread: list[LogLine] = field(default_factory=list)     # not yet seen by the tick rules
    launcher_codes: dict[int, int] = field(default_factory=dict)   # pid -> Popen returncode
    progress: ProgressLines = field(default_factory=ProgressLines)
    raised: RaisedLines = field(default_factory=RaisedLines)   # the exception printed last
    dropped: int = 0
    redactors: dict[str, LineRedactor] = field(default_factory=dict)   # per stream: key blocks

    def put(self, line: LogLine) -> None:
        """Called by the thread reading the relay: never blocks, and holds at most
        ``QUEUE_LINES`` lines (a burst of output must not grow the sidecar without bound): a
        full queue lets its oldest line go."""
        if len(self.lines) >= QUEUE_LINES:
            self.dropped += 1
        self.lines.append(line)

    def drain(self, seconds: float | None = None) -> Drained:
        """The queued lines, oldest first, read for at most ``seconds`` (None: all of them)."""
        batch: list[LogLine] = []
        progress_at = counted_at = unplaceable_at = None
        deadline = None if seconds is None else time.monotonic() + seconds
        while self.lines:
            if deadline is not None and len(batch) % CLOCK_EVERY == 0 and batch \
                    and time.monotonic() > deadline:
                break
            line = self._redacted(self.lines.popleft())
            batch.append(line)
            self.raised.feed((line,))
            self.tail.append(line.text)
            self.unread.append(line)
            if self.progress.is_progress(line.text):
                progress_at = line.t
            if self.progress.is_counted(line.text):
                counted_at = line.t
            if unplaceable(line.text):
                unplaceable_at = line.t
            parsed = parse_launcher_line(line.text)
            if parsed:
                self.launcher_codes[parsed[0]] = parsed[1]
        return Drained(batch, progress_at, counted_at, len(self.lines), unplaceable_at)

    def take_unread(self) -> tuple[LogLine, ...]:
        unread, self.unread = tuple(self.unread), []
        return unread

    def _redacted(self, line: LogLine) -> LogLine:
        redactor = self.redactors.get(line.stream)
        if redactor is None:
            redactor = self.redactors[line.stream] = LineRedactor()
        text = redactor.line(words_of(line.text))
        return line if text is line.text else dataclasses.replace(line, text=text)
