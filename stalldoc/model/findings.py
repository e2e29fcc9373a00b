"""What the rules conclude: a finding and its severity."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


# how severe, least first; keyed by the enum, so by its string value too ("critical" -> 3)
SEVERITY_LEVEL: dict[str, int] = {severity: level for level, severity in enumerate(Severity)}


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    ranks: tuple[int, ...]
    summary: str
    evidence: Mapping[str, Any]
    fix: str
