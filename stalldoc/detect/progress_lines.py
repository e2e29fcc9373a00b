"""The job's own progress lines: a logged training step, a progress bar that moved.

- swift: ``'global_step/max_steps': 'x/y'``, vLLM's "It took X seconds to fall asleep / wake up",
  "Memory cleanup attempt";
- HF Trainer / TRL: the logged metrics dict of a step (``{'loss': ..., 'epoch': ...}``);
- tqdm bars (``datasets.map``, evaluation loops, downloads): ``desc: 45%|####  | 450/1000 [...]``,
  counted only when the bar's count went up (a frozen bar redrawn is not progress).

A repeated warning is never progress: a hung vLLM prints "No available shared memory broadcast
block" every minute.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

PROGRESS_LINE = re.compile(r"global_step/max_steps|It took [\d.]+ seconds to (fall asleep|wake up)"
                           r"|Memory cleanup attempt|^\{'loss': [-+\d.eE]+, .*'epoch': [\d.]+")
_BAR = re.compile(r"^(?P<desc>[^|]*?)\s*\d{1,3}%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\b")


@dataclass
class ProgressLines:
    """Tells which lines of the job's output are progress; remembers each bar's count."""

    bars: dict[str, int] = field(default_factory=dict)

    def is_progress(self, text: str) -> bool:
        if PROGRESS_LINE.search(text):
            return True
        match = _BAR.search(text.strip())
        if match is None:
            return False
        desc, count = match.group("desc").strip(), int(match.group("n"))
        last = self.bars.get(desc)
        self.bars[desc] = count
        return last is not None and count > last
