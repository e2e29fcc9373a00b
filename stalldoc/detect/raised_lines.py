"""The exception a job printed last: the line that ends a Python traceback in its output
(``RuntimeError: ...``), whether the exception ended the process or was caught and logged by a
server's request handler (uvicorn, FastAPI), which a rank's agent never sees."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from stalldoc.model.samples import LogLine

_START = "Traceback (most recent call last):"
# what launchers and loggers put before a line: Ray's ``(Worker pid=12)``, torchrun's
# ``[rank1]:``, accelerate's ``[default0]:``, vLLM's ``ERROR 11-29 04:59:03 [executor.py:1063]``
_PREFIX = re.compile(r"^(?:\([^)]*\)\s*|\[[^\]]*\]:?\s*|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                     r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s?)+")
# ``pkg.module.SomeError: words`` or a bare ``SomeError``, unindented once prefixes are gone
_RAISED = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"
                     r"(?:Error|Exception|Exit|Interrupt|Timeout|Failure)\b(?::\s?.*)?)$")
MAX_TRACEBACK = 400   # lines of a traceback read before giving up on its end
MAX_TEXT = 500


@dataclass
class RaisedLines:
    """Fed the job's lines in order; keeps the last exception line and when it was printed."""

    text: str = ""
    t: float | None = None
    _open: int = 0   # lines read since a traceback began (0: none open)

    def feed(self, lines: Iterable[LogLine]) -> None:
        for line in lines:
            body = _PREFIX.sub("", line.text.rstrip(), count=1)
            if body.endswith(_START):
                self._open = 1
                continue
            if not self._open:
                continue
            found = _RAISED.match(body) if not body.startswith((" ", "\t")) else None
            if found:
                self.text, self.t, self._open = found.group(1)[:MAX_TEXT], line.t, 0
            elif self._open >= MAX_TRACEBACK:
                self._open = 0
            else:
                self._open += 1
