"""The shared shape of the kinds of failure (SD539-SD545): a class of failure lines, whatever
program printed them, read into their parts, with a fix for the kind and for what its parts say.

A rule that names one wording (SD506's ``CUDA out of memory. Tried to allocate``) says more than
its kind: a kind leaves to every other log rule the lines that rule matches, and to the kinds
defined before it (by code) the lines those match, so that one line makes one finding. A kind's
patterns are the kind's wordings as launchers, frameworks, kernels and libraries print them; its
evidence holds the parts each line carries (``line_parts.parts``) beside the pattern's own
figures, the first line's first.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, Mapping

from stalldoc.model.findings import Finding
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules.line_parts import parts
from stalldoc.rules.log_signature import LOG_RULES, LogSignature

Hits = list[tuple[LogLine, re.Match[str]]]


class LogKind(LogSignature):
    """A kind of failure (the base of SD539-SD545)."""

    kind: ClassVar[str]
    # what each group of wordings is (``host`` / ``device`` memory, the launcher that spoke) ->
    # its patterns: a kind's patterns, in this order; its label is ``what`` in the evidence
    wordings: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    labels: ClassVar[Mapping[str, str]] = {}     # derived: each pattern -> its wordings' label
    # a label -> the fix for what the lines said (the docstring's Fix for the others)
    fixes: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "wordings" in cls.__dict__:
            cls.labels = {p: label for label, group in cls.wordings.items() for p in group}
            cls.patterns = tuple(cls.labels)
        super().__init_subclass__(**kwargs)

    def hits(self, window: Window) -> Hits:
        return [(line, match) for line, match in super().hits(window)
                if not claimed(line.text, type(self))]

    def details(self, match: re.Match[str]) -> dict[str, Any]:
        found = {**parts(match.string), **super().details(match), "kind": self.kind}
        if (label := self.labels.get(match.re.pattern)) is not None:
            found["what"] = label
        return found

    def event(self, hits: Hits) -> Finding:
        finding = super().event(hits)
        return dataclasses.replace(finding, fix=self.fix_for(finding.evidence) or finding.fix)

    def blamed(self, hits: Hits, details: list[dict[str, Any]]) -> list[int]:
        """Also the ranks the lines name in their parts (mpirun's ``process rank N``)."""
        said = {rank for found in details if isinstance(rank := found.get("rank"), int)}
        return sorted({*super().blamed(hits, details), *said})

    def fix_for(self, evidence: Mapping[str, Any]) -> str | None:
        """A fix for what the lines say (their label's, or what a kind reads in their parts: a
        signal, a status), None for the kind's own."""
        return self.fixes.get(str(evidence.get("what")))


def claimed(text: str, kind: type[LogKind]) -> bool:
    """Whether another log rule matches ``text`` first: any rule that is not a kind, or a kind
    with a lower code."""
    for rule in LOG_RULES:
        if rule is kind or (issubclass(rule, LogKind) and rule.code >= kind.code):
            continue
        if rule.matches(text):
            return True
    return False
