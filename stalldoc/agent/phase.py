"""``stalldoc.phase("name")``: mark a phase of the training loop, as a context manager or decorator."""
from __future__ import annotations

import contextlib
from typing import Any

from stalldoc.agent import runtime


class phase(contextlib.ContextDecorator):  # noqa: N801 - public API reads like a function
    """Mark the code inside as phase ``name``. A no-op when the job is not watched."""

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> "phase":
        agent = runtime.current()
        if agent is not None:
            agent.guard(agent.phase_enter, self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        agent = runtime.current()
        if agent is not None:
            agent.guard(agent.phase_exit, self.name)
