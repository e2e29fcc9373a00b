"""The report formats: one module each, behind one small interface.

A format module defines ``REPORTER``, an object with ``name``, ``suffix`` (the usual file
extension) and ``render(report) -> str``, which reads only the typed records of ``Report``
(``stalldoc/report/records.py``). Modules are imported when their format is asked for, so the
heavy ones (Plotly for HTML) cost nothing otherwise.
"""
from __future__ import annotations

import importlib
from typing import ClassVar, Protocol

from stalldoc.report.records import Report

FORMATS: dict[str, str] = {
    "text": "stalldoc.report.formats.text",
    "json": "stalldoc.report.formats.json_format",
    "markdown": "stalldoc.report.formats.markdown",
    "html": "stalldoc.report.formats.html",
    "perfetto": "stalldoc.report.formats.perfetto",
}


class Reporter(Protocol):
    name: ClassVar[str]
    suffix: ClassVar[str]

    def render(self, report: Report) -> str:
        """The whole report in this format."""


def reporter(name: str) -> Reporter:
    """The reporter of format ``name`` (one of ``FORMATS``)."""
    return importlib.import_module(FORMATS[name]).REPORTER  # type: ignore[no-any-return]
