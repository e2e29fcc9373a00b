"""The arms: one module each, each with an ``ARM`` (see ``harness.Arm``)."""
from __future__ import annotations

import importlib

NAMES = ("stalldoc", "stalldoc_short", "pytorch", "pytorch_debug", "pyspy", "nvrx", "raytrain")


def load(name: str):
    module = importlib.import_module(f"arms.{name.split(':')[0]}")
    return module.ARM if ":" not in name else module.arm(name.split(":", 1)[1])
