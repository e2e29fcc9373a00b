"""The job's own progress lines: a logged training step, a progress bar that moved.

- swift: ``'global_step/max_steps': 'x/y'``, vLLM's "It took X seconds to fall asleep / wake up",
  "Memory cleanup attempt";
- HF Trainer / TRL: the logged metrics dict of a step (``{'loss': ..., 'epoch': ...}``);
- tqdm bars (``datasets.map``, evaluation loops, downloads): ``desc: 45%|####  | 450/1000 [...]``,
  counted only when the bar's count went up (a frozen bar redrawn is not progress).

A repeated warning is never progress: a hung vLLM prints "No available shared memory broadcast
block" every minute.

A script's own step lines (``step 12 loss 2.31``, ``Epoch 3 | iter 1200``, ``rollout step 39:``)
are *counted* lines (``is_counted``): a line whose step, iteration, epoch, batch, episode or
update number went up since the last line of the same shape. They are the job's progress only
where the job is one process (the watcher decides): in a job of several ranks one rank's step
lines say nothing of another's, which may hang while it steps (two worlds, independent workers).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

PROGRESS_LINE = re.compile(r"global_step/max_steps|It took [\d.]+ seconds to (fall asleep|wake up)"
                           r"|Memory cleanup attempt|^\{'loss': [-+\d.eE]+, .*'epoch': [\d.]+")
_COUNTER = re.compile(r"\b(?:global[_ ]?)?(?:step|iter|iteration|epoch|batch|episode|update)s?"
                      r"\b\s*[:=#\[]?\s*(?P<n>\d+)", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")
SHAPES = 256   # line shapes whose counts are remembered; the oldest are forgotten past this
_BAR = re.compile(r"^(?P<desc>[^|]*?)\s*\d{1,3}%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\b")


@dataclass
class ProgressLines:
    """Tells which lines of the job's output are progress; remembers each bar's count."""

    bars: dict[str, int] = field(default_factory=dict)
    counters: dict[str, tuple[int, ...]] = field(default_factory=dict)   # shape -> last counts

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

    def is_counted(self, text: str) -> bool:
        """A step line whose counts went up since the last line of its shape (the line with its
        numbers taken out): ``step 4`` after ``step 3``, ``epoch 2 step 0`` after ``epoch 1 step
        99`` (compared in order), never a line repeated, nor the first of its shape."""
        counts = tuple(int(m.group("n")) for m in _COUNTER.finditer(text))
        if not counts:
            return False
        shape = _DIGITS.sub("#", text.strip())[:200]
        last = self.counters.pop(shape, None)
        self.counters[shape] = counts
        if len(self.counters) > SHAPES:
            del self.counters[next(iter(self.counters))]
        return last is not None and counts > last
