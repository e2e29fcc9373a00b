"""stalldoc: why did my distributed training job stop making progress?

Only the agent's public API lives here, and it imports nothing outside the standard library:
this package is also imported inside every rank of a watched job.
"""
from __future__ import annotations

__all__ = ["phase", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``stalldoc.phase`` on first use: importing the package (which every process of a watched
    job does) costs nothing more."""
    if name == "phase":
        from stalldoc.agent.phase import phase
        return phase
    raise AttributeError(f"module 'stalldoc' has no attribute {name!r}")
