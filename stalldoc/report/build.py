"""The report document of one run directory (the JSON contract of ``stalldoc report``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from stalldoc.report.document import document
from stalldoc.report.read import read_report


def build_report(run_dir: Path) -> dict[str, Any]:
    """The report document of RUN_DIR; a damaged run is a RunDirError (one line, exit 1)."""
    return document(read_report([run_dir]))
