"""The shared shape of the SD5xx rules: a known line in the job's output, with its fix.

Each rule names its regular expressions; the engine shows it the lines printed since the last
tick. Lines prefixed ``[rankN]:`` (torch's own prefix) or ``[Rank N]`` blame that rank. A log
finding is an event: it is opened once, counted when the line repeats, never resolved by silence.
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Iterator

from stalldoc.model import Finding, Window
from stalldoc.rules.base import Rule

_RANK = re.compile(r"\[[Rr]ank\s*(\d+)\]")
MAX_LINES = 5


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
        ranks = sorted({int(m.group(1)) for line, _ in hits if (m := _RANK.search(line.text))})
        first_line, first_match = hits[0]
        evidence: dict[str, Any] = {
            "lines": [line.text.strip()[:400] for line, _ in hits][:MAX_LINES],
            "count": len(hits), "first_at": first_line.t, **self.details(first_match)}
        yield self.finding(ranks, f"{self.headline}: {first_line.text.strip()[:200]}", evidence)

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        """Figures read out of the first matching line (named groups by default)."""
        return {k: v for k, v in match.groupdict().items() if v is not None}


def _first_match(patterns: list[re.Pattern[str]], text: str) -> re.Match[str] | None:
    """The first pattern that matches the line (a line counts once)."""
    return next((m for p in patterns if (m := p.search(text))), None)
