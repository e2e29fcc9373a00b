"""A saved log, read line by line: plain or gzip, UTF-8 (or UTF-16 with its mark), one rank's
or a launcher's merged output.

What it holds is judged before its lines are used: a file that cannot be opened, holds NUL bytes
(a binary), is not UTF-8 text, has a line over ``MAX_LINE`` bytes, or is a gzip that does not
inflate, is a ``LogInputError`` with one line. Its rank comes from its name where the name says
it (``rank3.log``, ``train_rank_12.out``: a global rank), or torchrun's ``--log-dir`` layout
(``attempt_0/3/stderr.log``: a *local* rank); the ranks its lines name (``[rank3]:``, torchrun's
``[default3]:``) are counted as it is read.
"""
from __future__ import annotations

import codecs
import gzip
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Iterator

from stalldoc.errors import StalldocError
from stalldoc.logs.times import stamp
from stalldoc.model.samples import LogLine, words_of
from stalldoc.redact import LineRedactor

MAX_LINE = 1 << 20          # bytes: a longer line is no log's
KEEP = 64 * 1024            # characters of a long line the rules read
SNIFF = 64 * 1024           # bytes judged before reading
WAIT_FOR_STAMP = 100_000    # lines held until the file's first stamp times them
EXIT_BAD_LOG = 1
_RANK_NAME = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,6})(?!\d)", re.I)
_ATTEMPT = re.compile(r"^attempt_\d+$")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]:")
_LOCAL_PREFIX = re.compile(r"^\[default(\d+)\]:")


class LogInputError(StalldocError):
    """A file that is no log stalldoc can read."""

    exit_code = EXIT_BAD_LOG


@dataclass(frozen=True)
class Read:
    """What was read of one file."""

    path: str
    rank: int | None            # the global rank its name says
    local_rank: int | None      # the local rank torchrun's log directory says
    lines: int
    stamped: int                # lines with a time stamp of their own
    first_at: float | None
    last_at: float | None
    ranks: tuple[int, ...]      # global ranks its lines' [rankN]: prefixes name
    local_ranks: tuple[int, ...]   # local ranks of torchrun's [defaultN]: prefixes

    def as_json(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class LogFile:
    """One saved log: ``lines()`` yields its lines once, timed; ``read`` then says what it held."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rank, self.local_rank = rank_of_name(path)
        try:
            self.mtime = path.stat().st_mtime
        except OSError as exc:
            raise LogInputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        self.encoding = self._judge()
        self._count = 0
        self._stamped = 0
        self._first: float | None = None
        self._last: float | None = None
        self._ranks: Counter[int] = Counter()
        self._local: Counter[int] = Counter()

    def _open(self) -> BinaryIO:
        try:
            with open(self.path, "rb") as fh:
                gz = fh.read(2) == b"\x1f\x8b"
            return gzip.open(self.path, "rb") if gz else open(self.path, "rb")  # noqa: SIM115
        except IsADirectoryError as exc:
            raise LogInputError(f"{self.path}: a directory, not a log file") from exc
        except OSError as exc:
            raise LogInputError(f"{self.path}: cannot read ({exc.strerror or exc})") from exc

    def _judge(self) -> str:
        """The file's encoding, from its first ``SNIFF`` bytes; an error for what is no text."""
        with self._open() as fh:
            head = _read(fh, SNIFF, self.path)
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            return "utf-16"
        if b"\x00" in head:
            raise LogInputError(f"{self.path}: a binary file (NUL bytes), not a log")
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        except UnicodeDecodeError as exc:
            raise LogInputError(f"{self.path}: not UTF-8 text (byte {exc.start} of the file); "
                                "convert it first, e.g. iconv -f LATIN1 -t UTF-8") from exc
        return "utf-8-sig"

    def lines(self) -> Iterator[LogLine]:
        """Every line, with the time its stamp says (or the last stamp before it; lines before
        the first stamp take that stamp; a file without any, its last change)."""
        year = datetime.fromtimestamp(self.mtime).year
        waiting: list[str] = []
        last: float | None = None
        for text in self._texts():
            t = stamp(text, year)
            if t is not None:
                last = t
                self._stamped += 1
            elif last is None:
                if len(waiting) < WAIT_FOR_STAMP:
                    waiting.append(text)
                    continue
                last = self.mtime          # no stamp in the first lines: the file's time
            for held in waiting:
                yield self._line(last, held)
            waiting = []
            yield self._line(last, text)
        for held in waiting:
            yield self._line(self.mtime, held)

    def _line(self, t: float, text: str) -> LogLine:
        self._count += 1
        self._first = t if self._first is None else self._first
        self._last = t
        if (match := _TORCH_RANK.match(text)) is not None:
            self._ranks[int(match.group(1))] += 1
        elif (match := _LOCAL_PREFIX.match(text)) is not None:
            self._local[int(match.group(1))] += 1
        return LogLine(t, "log", text, self.rank)

    def _texts(self) -> Iterator[str]:
        """The file's lines as the watcher reads a live job's: decoded, without their line ends
        and escape sequences, redacted (before anything else sees them), long ones cut to
        ``KEEP``."""
        redactor = LineRedactor()
        for text in self._decoded():
            yield redactor.line(words_of(text)[:KEEP])

    def _decoded(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder(self.encoding)(errors="replace")
        with self._open() as fh:
            if self.encoding == "utf-16":
                yield from decoder.decode(_read(fh, -1, self.path), final=True).splitlines()
                return
            number = 0
            while raw := _readline(fh, self.path):
                number += 1
                if len(raw) > MAX_LINE:
                    raise LogInputError(f"{self.path}: line {number} is over "
                                        f"{MAX_LINE >> 20} MiB: not a log")
                yield decoder.decode(raw).rstrip("\r\n")

    @property
    def read(self) -> Read:
        return Read(str(self.path), self.rank, self.local_rank, self._count, self._stamped,
                    self._first, self._last, tuple(sorted(self._ranks)),
                    tuple(sorted(self._local)))


def rank_of_name(path: Path) -> tuple[int | None, int | None]:
    """(global rank, local rank) the file's name or torchrun's log directory says."""
    if (match := _RANK_NAME.search(path.name)) is not None:
        return int(match.group(1)), None
    parent = path.parent
    if parent.name.isdigit() and _ATTEMPT.match(parent.parent.name):
        return None, int(parent.name)
    return None, None


def _read(fh: BinaryIO, size: int, path: Path) -> bytes:
    try:
        return fh.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        raise LogInputError(f"{path}: cannot be read: {exc}") from exc


def _readline(fh: BinaryIO, path: Path) -> bytes:
    try:
        return fh.readline(MAX_LINE + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise LogInputError(f"{path}: cannot be read: {exc}") from exc
