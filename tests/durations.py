"""What each slow test cost in a run of README's test command (pytest-xdist's workers), for
the workers to start the long ones first.

``durations.txt`` holds ``seconds nodeid`` lines (setup, call and teardown summed) for the tests
that took a second or more. It only orders the tests: a test missing from it, or a figure out of
date, changes when a test starts, never whether it runs or passes. To remake it:

    python -m pytest -q -n auto --durations=0 > /tmp/run.log
    python tests/durations.py /tmp/run.log > tests/durations.txt
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "durations.txt"
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*)$")
# the group pytest-xdist appends to a nodeid (``...[3-1]@ray_clusters``, ``...@tests/x.py``):
# after the test's name or its parameters' brackets, never inside them
XDIST_GROUP = re.compile(r"@[^\[\]\s@]+$")


def expected_seconds(table: Path = TABLE) -> dict[str, float]:
    """nodeid -> seconds, from the table (empty where it is absent)."""
    seconds: dict[str, float] = {}
    if table.is_file():
        for line in table.read_text(encoding="utf-8").splitlines():
            cost, _, nodeid = line.partition(" ")
            if nodeid:
                seconds[nodeid] = float(cost)
    return seconds


def from_log(text: str, at_least: float = 1.0) -> dict[str, float]:
    """nodeid -> seconds summed over its phases, from pytest's ``--durations=0`` lines."""
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if match:
            nodeid = XDIST_GROUP.sub("", match.group(2).strip())
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(match.group(1))
    return {nodeid: cost for nodeid, cost in seconds.items() if cost >= at_least}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/durations.py SERIAL_PYTEST_LOG", file=sys.stderr)
        return 2
    costs = from_log(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    for nodeid, cost in sorted(costs.items(), key=lambda item: (-item[1], item[0])):
        print(f"{cost:.1f} {nodeid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
