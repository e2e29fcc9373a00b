"""``--format json``: the report document (``document.py``), indented."""
from __future__ import annotations

import json
from typing import ClassVar

from stalldoc.report.document import document
from stalldoc.report.records import Report


class JsonReporter:
    name: ClassVar[str] = "json"
    suffix: ClassVar[str] = ".json"

    def render(self, report: Report) -> str:
        return json.dumps(document(report), indent=2, default=str)


REPORTER = JsonReporter()
