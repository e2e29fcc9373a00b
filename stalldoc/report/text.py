"""A finding's lines on a terminal: what the watcher and ``check`` print and the text report
shows (the whole text report is ``stalldoc/report/formats/text.py``); what ``stalldoc logs``
read of each file, as it says it and the text report shows it."""
from __future__ import annotations

import textwrap
import time
from typing import Any, Iterable, Mapping

from stalldoc.findings.record import finding_fields
from stalldoc.model.findings import Finding


FIX_WIDTH = 100   # a fix is prose: read in a terminal, a line of it fits this many columns


def record_lines(record: Mapping[str, Any]) -> list[str]:
    """A finding's lines, from its record (``stalldoc.findings.record``): what the watcher
    prints, ``check`` prints and the report shows. The summary stays one line (what a person
    greps for); the fix is prose, wrapped at ``FIX_WIDTH`` columns."""
    frames = list(record["evidence"].get("frames", []))
    lines = [f"  [{record['code']} {record['severity']}] {record['summary']}"]
    lines += [f"      {frame}" for frame in frames[:8]]
    lines += textwrap.wrap(record["fix"], FIX_WIDTH, initial_indent="      fix: ",
                           subsequent_indent=" " * 11, break_long_words=False,
                           break_on_hyphens=False) or ["      fix:"]
    return lines


def render_findings(findings: Iterable[Finding]) -> str:
    """What the watcher prints when it has a diagnosis."""
    return "\n".join(line for f in findings for line in record_lines(finding_fields(f)))


def read_summary(read: Mapping[str, Any]) -> str:
    """One file ``stalldoc logs`` read (its ``logs_read`` item): its lines, its ranks and how
    they were known, its times."""
    span = (f", {_clock(read.get('first_at'))} to {_clock(read.get('last_at'))}"
            if read.get("stamped") else ", no time stamps (lines in the file's order)")
    return f"{read.get('path')}: {read.get('lines', 0):,} lines{_ranks_read(read)}{span}"


def _ranks_read(read: Mapping[str, Any]) -> str:
    if read.get("rank") is not None:
        return f", rank {read['rank']} (its name)"
    if read.get("local_rank") is not None:
        return f", local rank {read['local_rank']} (torchrun's log directory)"
    if read.get("ranks"):
        return f", ranks {_span(read['ranks'])} (their [rankN]: prefixes)"
    if read.get("local_ranks"):
        return f", local ranks {_span(read['local_ranks'])} (torchrun's [defaultN]: prefixes)"
    return ", ranks not said"


def _span(ranks: list[int]) -> str:
    contiguous = list(ranks) == list(range(ranks[0], ranks[-1] + 1))
    return f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 2 else ",".join(map(str, ranks))


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "-"
