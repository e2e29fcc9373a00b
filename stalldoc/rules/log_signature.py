"""The shared shape of the SD5xx rules: a known line in the job's output, with its fix.

Each rule names its regular expressions; the engine shows it the lines printed since the last
tick. A log finding is an event: it is opened once, counted when the line repeats, never resolved
by silence.

The ranks a finding blames are global ranks, read only where the line really carries one
(``line_rank``): torch's own ``[rankN]:`` prefix first; then a ProcessGroupNCCL tag of the default
group (``[PG ID 0 PG GUID 0(default_pg) Rank 3]``, ``[PG 0 Rank 3]``, ``[PG 0 (default_pg) Rank 3]``),
whose rank is the global one; a tag of any other group names a rank *in that group* and blames
nobody; last a bare ``[Rank N]`` (DeepSpeed's ``log_dist``, torch <= 2.1's watchdog, which knew no
other). Launcher prefixes (torchrun's ``[default3]:``, mpirun's ``[1,3]<stderr>:``, srun's ``3: ``)
carry *local* ranks or task ids and are never read.
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Iterator

from stalldoc.model import Finding, LogLine, Window
from stalldoc.rules.base import Rule

_TORCH_PREFIX = re.compile(r"\[rank(\d+)\]")
_PG_TAG = re.compile(r"\[PG (?:ID )?(?P<id>\d+)(?: PG GUID \d+)? ?(?:\((?P<name>[^)]*)\))? Rank "
                     r"(?P<rank>\d+)\]")
_BARE_RANK = re.compile(r"\[[Rr]ank\s*(\d+)\]")
MAX_LINES = 5


def line_rank(text: str) -> int | None:
    """The global rank a line was printed by, where the line says it (None where it does not)."""
    if match := _TORCH_PREFIX.search(text):
        return int(match.group(1))
    if tag := _PG_TAG.search(text):
        default = tag["id"] == "0" or tag["name"] == "default_pg"
        return int(tag["rank"]) if default else None
    match = _BARE_RANK.search(text)
    return int(match.group(1)) if match else None


def line_group(text: str) -> str | None:
    """The process group a ProcessGroupNCCL line names: its description, else its id."""
    tag = _PG_TAG.search(text)
    return (tag["name"] or tag["id"]) if tag else None


class LogSignature(Rule):
    trigger = "tick"
    sticky = True
    patterns: ClassVar[tuple[str, ...]]
    headline: ClassVar[str]

    def check(self, window: Window) -> Iterator[Finding]:
        compiled = [re.compile(p) for p in self.patterns]
        hits = [(line, match) for line in window.log
                if (match := _first_match(compiled, line.text))]
        if not hits:
            return
        first_line = hits[0][0]
        evidence: dict[str, Any] = {
            "lines": [line.text.strip()[:400] for line, _ in hits][:MAX_LINES],
            "count": len(hits), "first_at": first_line.t, **self._figures(hits)}
        ranks = sorted({r for line, _ in hits if (r := line_rank(line.text)) is not None})
        yield self.finding(ranks, f"{self.headline}: {first_line.text.strip()[:200]}", evidence)

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        """Figures read out of a matching line (named groups by default)."""
        return {k: v for k, v in match.groupdict().items() if v is not None}

    def _figures(self, hits: list[tuple[LogLine, re.Match[str]]]) -> dict[str, Any]:
        """The first line's figures, completed by later lines (a timeout's status line adds the
        last completed work to the line that named the op); the process group where one is named."""
        figures: dict[str, Any] = {}
        for line, match in hits:
            for key, value in self.details(match).items():
                figures.setdefault(key, value)
            if (group := line_group(line.text)) is not None:
                figures.setdefault("pg", group)
        return figures


def _first_match(patterns: list[re.Pattern[str]], text: str) -> re.Match[str] | None:
    """The first pattern that matches the line (a line counts once)."""
    return next((m for p in patterns if (m := p.search(text))), None)
