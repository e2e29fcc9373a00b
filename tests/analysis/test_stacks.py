"""Reading stacks: which source lines take a lock."""
from __future__ import annotations

from stalldoc.analysis.stacks import is_lock_line


def test_a_lock_line_is_code_that_takes_a_lock_not_a_word_in_a_comment():
    """A job script's `with open(shard) as fh:  # blocks here on a stuck mount` was read as a
    lock (SD104) because "blocks" holds "lock"."""
    taking = ["with self._lock:", "    with cache_lock:", "with threading.Lock():",
              "lk.acquire()", "async with self.sem:", "with cond:"]
    not_taking = ["with open(p) as fh:  # blocks here", "with self._blocking_io():",
                  "x = 1  # lock.acquire(", "with clock_source():"]
    assert [is_lock_line(t) for t in taking] == [True] * len(taking)
    assert [is_lock_line(t) for t in not_taking] == [False] * len(not_taking)
