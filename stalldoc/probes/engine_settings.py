"""The settings vLLM really got, as a process's agent recorded them when it created an engine
(``agent/hooks.recorded_engine_args``: ``vllm-<pid>.json``, one JSON line per engine, the last
one current). Read for a rank's own process at a stall: a colocated engine
(``distributed_executor_backend="external_launcher"``) runs inside the rank, and its tensor-
parallel group is made of ranks of the job."""
from __future__ import annotations

import json
from typing import Any

from stalldoc.agent.statefile import ENGINE_FIELDS, engine_settings_path

MAX_BYTES = 64 << 10


def read_engine_settings(directory: str | None, pid: int) -> dict[str, Any] | None:
    """The settings of the last engine process ``pid`` created (None: it created none, or its
    file says nothing readable). Only scalar values of ``ENGINE_FIELDS`` (what the agent
    records) are kept."""
    if not directory:
        return None
    try:
        with open(engine_settings_path(directory, pid), encoding="utf-8",
                  errors="replace") as fh:
            lines = fh.read(MAX_BYTES).splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            values = json.loads(line)
        except ValueError:
            continue   # a line cut by a write in progress, or not ours
        if isinstance(values, dict):
            return {k: v for k, v in values.items() if k in ENGINE_FIELDS
                    and (v is None or isinstance(v, (bool, int, float, str)))}
    return None

