"""Fixtures only; the helpers live in support.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support import Result, watch


@pytest.fixture
def run_watch(tmp_path: Path):
    def _run(command: list[str], *options: str, **kwargs: Any) -> Result:
        return watch(tmp_path, command, *options, **kwargs)
    return _run
