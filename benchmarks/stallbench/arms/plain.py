"""No tool: the launch command alone (for checking a scenario, not scored in the table)."""
from __future__ import annotations

from arms.pyspy import PySpy

ARM = PySpy("plain")
