"""The shared shape of the SD5xx rules: a known line in the job's output, with its fix.

Each rule names its regular expressions; the engine shows it the lines printed since the last
tick. A log finding is an event: it is opened once, counted when the line repeats, never resolved
by silence.

The ranks a finding blames are global ranks, read only where the line really carries one
(``line_rank``): torch's own ``[rankN]:`` prefix first; then a ProcessGroupNCCL tag of the default
group (``[PG ID 0 PG GUID 0(default_pg) Rank 3]``, ``[PG 0 Rank 3]``, ``[PG 0 (default_pg) Rank 3]``),
whose rank is the global one; a tag of any other group names a rank *in that group* and blames
nobody; last a bare ``[Rank N]`` (DeepSpeed's ``log_dist``; torch <= 2.1's watchdog, whose only
rank it is: the global one for the default group, a subgroup's own rank otherwise, which such a
line cannot tell). Launcher prefixes (torchrun's ``[default3]:``, mpirun's ``[1,3]<stderr>:``, srun's ``3: ``)
carry *local* ranks or task ids and are never read.

Every line of the job passes every log rule, so each pattern first looks for its required
literal (``required_literal``: the longest plain text every match contains) with ``in``, and runs
the regular expression only on lines that have it.
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Iterator

from stalldoc.model.findings import Finding
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules.base import Rule

_TORCH_PREFIX = re.compile(r"\[rank(\d+)\]")
_PG_TAG = re.compile(r"\[PG (?:ID )?(?P<id>\d+)(?: PG GUID \d+)? ?(?:\((?P<name>[^)]*)\))? Rank "
                     r"(?P<rank>\d+)\]")
_BARE_RANK = re.compile(r"\[[Rr]ank\s*(\d+)\]")
_QUANTIFIERS = "?*{"
MAX_LINES = 5
# the start of a line as a launcher prefixes it (torchrun's ``[default3]:``, mpirun's
# ``[1,3]<stderr>:``, srun's and pdsh's ``3: ``, Ray's ``(Worker pid=N)``): for patterns that hold
# a whole line
LINE_START = (r"^(?:\[\w+\]:|\[\d+,\d+\]<std(?:out|err)>:|[\w.-]+: "
              r"|\(\w+ pid=\d+(?:, ip=[^)\s]+)?\) ){0,2}")
LOG_RULES: list[type[LogSignature]] = []     # every log rule, in the order defined


def line_rank(text: str) -> int | None:
    """The global rank a line was printed by, where the line says it (None where it does not)."""
    if match := _TORCH_PREFIX.search(text):
        return int(match.group(1))
    if tag := _PG_TAG.search(text):
        default = tag["id"] == "0" or tag["name"] == "default_pg"
        return int(tag["rank"]) if default else None
    match = _BARE_RANK.search(text)
    return int(match.group(1)) if match else None


def rank_of(line: LogLine) -> int | None:
    """The global rank that printed ``line``: where it was read from (one file per rank, read by
    ``stalldoc logs``), else what its text says."""
    return line.rank if line.rank is not None else line_rank(line.text)


def line_group(text: str) -> str | None:
    """The process group a ProcessGroupNCCL line names: its description, else its id."""
    tag = _PG_TAG.search(text)
    return (tag["name"] or tag["id"]) if tag else None


def required_literal(pattern: str) -> str:
    """The longest run of plain characters that every match of ``pattern`` contains ('' when
    none is certain: a top-level alternation, a case-insensitive pattern). Groups, classes and
    escapes such as ``\\d`` end a run; a character made optional by ``?``, ``*`` or ``{`` leaves it."""
    if "|" in _top_level(pattern) or re.compile(pattern).flags & re.IGNORECASE:
        return ""
    runs, run, i = [""], "", 0
    while i < len(pattern):
        char, i = pattern[i], i + 1
        if char == "\\" and i < len(pattern) and not pattern[i].isalnum():
            char, i = pattern[i], i + 1            # an escaped punctuation mark: itself
        elif char in "([\\.^$+" + _QUANTIFIERS or char == ")":
            if char in _QUANTIFIERS:
                run = run[:-1]                      # the character before was optional
            runs.append(run)
            run, i = "", _skip(pattern, i - 1)
            continue
        run += char
    return max([*runs, run], key=len)


def _skip(pattern: str, i: int) -> int:
    """The index after the construct that starts at ``pattern[i]`` (a group, a class, an escape,
    a counted repeat; one character otherwise)."""
    opening = pattern[i]
    if opening == "\\":
        return i + 2
    if opening == "{":
        return pattern.index("}", i) + 1
    if opening == "[":
        return _class_end(pattern, i)
    if opening != "(":
        return i + 1
    depth = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            i = _class_end(pattern, i)
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        i += 1
        if depth == 0:
            return i
    return i


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class that starts at ``pattern[i]``."""
    i += 2 if pattern[i + 1:i + 2] == "^" else 1
    i += 1 if pattern[i:i + 1] == "]" else 0      # a ] first in the class is a character
    while pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _top_level(pattern: str) -> str:
    """The pattern without its groups, classes and escapes (what an alternation splits)."""
    out, i = [], 0
    while i < len(pattern):
        end = _skip(pattern, i) if pattern[i] in "([\\" else i + 1
        out.append(pattern[i] if end == i + 1 else " ")
        i = end
    return "".join(out)


class LogSignature(Rule):
    trigger = "tick"
    sticky = True
    patterns: ClassVar[tuple[str, ...]]
    headline: ClassVar[str]
    # patterns (a subset of ``patterns``) that libraries also print at a normal shutdown: when
    # every line of the event is one of them, the evidence says ``at_shutdown`` and the watcher
    # resolves the finding if the job then exits 0
    shutdown_patterns: ClassVar[tuple[str, ...]] = ()
    # lines this rule matches but leaves to another rule, because what they quote is that rule's
    # cause (a watchdog that ended on a CUDA error: the CUDA error, SD540), so that a line makes
    # one finding
    yields: ClassVar[tuple[str, ...]] = ()
    _program: ClassVar[list[tuple[str, re.Pattern[str]]]]

    @classmethod
    def program(cls) -> list[tuple[str, re.Pattern[str]]]:
        """Each pattern compiled, with its required literal (built once per rule class)."""
        if "_program" not in cls.__dict__:
            cls._program = [(required_literal(p), re.compile(p)) for p in cls.patterns]
        return cls._program

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every log rule (a class with a ``code``) is known here, in the order defined: the
        kinds of failure (``log_kind.py``) leave to the others the lines those match."""
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            LOG_RULES.append(cls)

    def check(self, window: Window) -> Iterator[Finding]:
        hits = self.hits(window)
        if hits:
            yield self.event(hits)

    def hits(self, window: Window) -> list[tuple[LogLine, re.Match[str]]]:
        """The window's new lines this rule matches, each with its match."""
        hits = matching_lines(self.program(), window.log)
        if self.yields:
            hits = [(line, match) for line, match in hits if not self.leaves(line.text)]
        return hits

    @classmethod
    def matches(cls, text: str) -> bool:
        """Whether this rule takes ``text`` (matches it and does not leave it to a kind)."""
        return (any(needle in text and pattern.search(text) for needle, pattern in cls.program())
                and not cls.leaves(text))

    @classmethod
    def leaves(cls, text: str) -> bool:
        """Whether ``text`` is one of the lines this rule leaves to the kinds."""
        return any(re.search(pattern, text) for pattern in cls.yields)

    def event(self, hits: list[tuple[LogLine, re.Match[str]]]) -> Finding:
        """The finding of the lines matched in one tick."""
        first_line = hits[0][0]
        last_line = hits[-1][0]
        details = [self.details(match) for _, match in hits]
        evidence: dict[str, Any] = {
            "lines": [line.text.strip()[:400] for line, _ in hits][:MAX_LINES],
            "count": len(hits), "first_at": first_line.t, "last_at": last_line.t,
            "last_line": last_line.text.strip()[:400], **_figures(hits, details)}
        if self.shutdown_patterns and all(m.re.pattern in self.shutdown_patterns
                                          for _, m in hits):
            evidence["at_shutdown"] = True
        return self.finding(self.blamed(hits, details),
                            f"{self.headline}: {first_line.text.strip()[:200]}", evidence)

    def blamed(self, hits: list[tuple[LogLine, re.Match[str]]],
               details: list[dict[str, Any]]) -> list[int]:
        """The global ranks that printed the lines, where known (``details``: each line's)."""
        return sorted({r for line, _ in hits if (r := rank_of(line)) is not None})

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        """Figures read out of a matching line (named groups by default)."""
        return {k: v for k, v in match.groupdict().items() if v is not None}


def _figures(hits: list[tuple[LogLine, re.Match[str]]],
             details: list[dict[str, Any]]) -> dict[str, Any]:
    """The first line's figures (``details``: each line's), completed by later lines (a timeout's
    status line adds the last completed work to the line that named the op); the process group
    where one is named."""
    figures: dict[str, Any] = {}
    for (line, _), found in zip(hits, details):
        for key, value in found.items():
            figures.setdefault(key, value)
        if (group := line_group(line.text)) is not None:
            figures.setdefault("pg", group)
    return figures


def matching_lines(program: list[tuple[str, re.Pattern[str]]],
          lines: tuple[LogLine, ...]) -> list[tuple[LogLine, re.Match[str]]]:
    """Each line with the first pattern that matches it (a line counts once). Written as plain
    loops: every line of the job passes here once per log rule."""
    hits = []
    for line in lines:
        text = line.text
        for needle, pattern in program:
            if needle in text and (match := pattern.search(text)):
                hits.append((line, match))
                break
    return hits
