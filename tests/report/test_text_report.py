"""The text report of a real demo run: how it ended, the waiting ranks' stacks, aligned tables."""
from __future__ import annotations

import subprocess
import sys

from support import demo_run


def text_report() -> str:
    return subprocess.run([sys.executable, "-m", "stalldoc", "report", str(demo_run())],
                          capture_output=True, text=True, check=True).stdout


def test_the_waiting_ranks_stacks_are_shown_grouped_beside_the_culprits():
    text = text_report()
    waiting = [line for line in text.splitlines() if line.startswith("Stack at stall #1:")]
    assert any("ranks 0,2 (waiting: collective)" in line for line in waiting), waiting
    assert any("rank 1 (waiting: sleep) in load_shard" in line for line in waiting), waiting
    block = text.split("ranks 0,2 (waiting: collective)")[1]
    assert block.splitlines()[1].strip().startswith("all_reduce (")


def test_tables_are_aligned():
    # every row of a table starts each column where its header does (a table ends at the
    # first blank line): the phases', and where the steps went when the demo ran enough steps
    lines = text_report().splitlines()
    headers = [i for i, line in enumerate(lines)
               if line.split()[:2] in (["name", "count"], ["rank", "over"])]
    assert lines[headers[0]].split()[:2] == ["name", "count"], lines
    for header in headers:
        end = next((i for i in range(header + 1, len(lines)) if not lines[i].strip()), len(lines))
        rows = lines[header + 1:end]
        width = len(lines[header])
        assert rows and all(len(row) == width for row in rows), (lines[header], rows)


def test_a_run_ended_by_stalldoc_says_so():
    text = text_report()
    end = next(line for line in text.splitlines() if line.strip().startswith("end "))
    assert "ended by stalldoc: --on-stall kill" in end and "watch exit 124" in end, end
