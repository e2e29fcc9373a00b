"""How many requests a process's vLLM scheduler has preempted (thrown out of a full KV cache,
to be recomputed), as its agent counted them (``agent/hooks.preempted``: ``preempted-<pid>.txt``,
one line per write, the last one the count; written at most once a second, so the count may lag
the engine by the preemptions of its last second). vLLM's V1 engine prints no line for a
preemption: this count is what the offline engine offers instead of its server's
``vllm:num_preemptions_total``."""
from __future__ import annotations

import os

from stalldoc.agent.statefile import preempted_path

TAIL_BYTES = 64


def read_preemptions(directory: str | None, pid: int) -> int | None:
    """The count process ``pid``'s agent last wrote (None: it wrote none, or no count)."""
    if not directory:
        return None
    try:
        with open(preempted_path(directory, pid), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - TAIL_BYTES))
            lines = fh.read(TAIL_BYTES).split(b"\n")
    except OSError:
        return None
    whole = [line for line in lines[:-1] if line.strip().isdigit()]   # the last may be cut
    return int(whole[-1]) if whole else None
