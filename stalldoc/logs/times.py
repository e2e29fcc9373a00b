"""When a saved log's line was printed, where its text says: the stamps that loggers of the
ecosystem put at a line's start (Python's logging and DeepSpeed's ``2024-05-01 12:00:03,456``,
ISO 8601 with a zone, Ray's ``[2025-12-07 09:57:19,206 E ...]``, glog's and torch's C++
``E0901 05:20:03.124073``, vLLM's ``INFO 05-14 10:37:05``, C's ``Fri Sep 28 11:14:00 2018``).

A stamp without a zone is the machine's local time, as the reports show times; a stamp without
a year (glog's, vLLM's) takes the year of the file's last change. Only the first ``SCAN``
characters are looked at: a stamp is where a line starts, behind a launcher's prefix.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

SCAN = 96
_ISO = re.compile(r"(?<!\d)(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[,.](\d{1,9}))?"
                  r"(Z|[+-]\d\d:?\d\d)?")
# glog's month is two digits, torch's C++ log's one or two (``E410`` is April 10)
_GLOG = re.compile(r"(?:^|[\[\s:\]>)])[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)"
                   r"(?:\.(\d{1,9}))?\b")
_VLLM = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
_CTIME = re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|"
                    r"Nov|Dec) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\b")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def stamp(text: str, year: int) -> float | None:
    """The time a line's stamp says (seconds since the epoch), None where it has none."""
    head = text[:SCAN]
    for reader in (_iso, _glog, _vllm, _ctime):
        try:
            found = reader(head, year)
        except ValueError:          # a stamp-shaped number that is no date (month 13)
            found = None
        if found is not None:
            return found
    return None


def _iso(head: str, year: int) -> float | None:
    match = _ISO.search(head)
    if match is None:
        return None
    y, mo, d, h, mi, s = (int(x) for x in match.groups()[:6])
    zone = _zone(match.group(8))
    return datetime(y, mo, d, h, mi, s, _micro(match.group(7)), tzinfo=zone).timestamp()


def _glog(head: str, year: int) -> float | None:
    match = _GLOG.search(head)
    if match is None:
        return None
    mo, d, h, mi, s = (int(x) for x in match.groups()[:5])
    return datetime(year, mo, d, h, mi, s, _micro(match.group(6))).timestamp()


def _vllm(head: str, year: int) -> float | None:
    match = _VLLM.search(head)
    if match is None:
        return None
    mo, d, h, mi, s = (int(x) for x in match.groups())
    return datetime(year, mo, d, h, mi, s).timestamp()


def _ctime(head: str, year: int) -> float | None:
    match = _CTIME.search(head)
    if match is None:
        return None
    month = _MONTHS.index(match.group(1)) + 1
    d, h, mi, s, y = (int(x) for x in match.groups()[1:])
    return datetime(y, month, d, h, mi, s).timestamp()


def _micro(fraction: str | None) -> int:
    return int((fraction or "0")[:6].ljust(6, "0"))


def _zone(text: str | None) -> timezone | None:
    """The zone a stamp names (None: local time)."""
    if text is None:
        return None
    if text == "Z":
        return timezone.utc
    sign = -1 if text[0] == "-" else 1
    hours, minutes = int(text[1:3]), int(text[-2:])
    return timezone(sign * timedelta(hours=hours, minutes=minutes))
