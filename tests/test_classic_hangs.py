"""The classic DDP hangs named for what they are, from real reproducers (each scenario cites its
sources): real torchrun gloo jobs under watch, the finding's cause (``evidence.cause``) and its
fix, in the JSON, text, markdown and HTML reports; and no cause claimed where the evidence does
not decide one."""
from __future__ import annotations

import subprocess
import sys

import pytest

from support import torchrun

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("nproc,records,after,ahead", [
    (2, 9, "barrier", [0]),                 # rank 0: 5 batches, rank 1: 4
    (3, 10, "all_gather_object", [0]),      # 4, 3, 3
    (3, 11, "barrier", [0, 1]),             # 4, 4, 3: two ranks ahead
])
def test_uneven_inputs_are_named_as_ranks_that_ran_different_numbers_of_steps(
        run_watch, nproc, records, after, ahead):
    # GIVEN DDP over a sharded dataset whose records do not split evenly over the ranks
    result = run_watch(torchrun(nproc, "sharded_uneven.py"), "--on-stall", "kill",
                       env={"RECORDS": str(records), "AFTER": after}, timeout=200)
    assert result.code == 124, result.stderr
    # THEN the ranks with a batch more are named, waiting in DDP's gradient all-reduce from
    # backward() where the others wait in the collective after their loop
    [finding] = result.findings("SD101")
    assert finding["ranks"] == ahead, finding["summary"]
    cause = finding["evidence"]["cause"]
    assert cause["kind"] == "uneven_steps", cause
    behind = min(set(range(nproc)) - set(ahead))
    assert cause["ops"] == {str(ahead[0]): "all_reduce",
                            str(behind): "barrier" if after == "barrier" else "all_gather"}
    assert cause["frames"][str(ahead[0])].startswith("train (") and \
        "sharded_uneven.py" in cause["frames"][str(ahead[0])], cause
    assert cause["frames"][str(behind)].startswith("main ("), cause
    assert "different numbers of steps (uneven inputs)" in finding["summary"]
    assert "drop_last" in finding["fix"] and "join()" in finding["fix"]
    # AND every report a person reads says it
    for fmt in ("text", "markdown", "html"):
        out = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(result.run_dir),
                              "--format", fmt], capture_output=True, text=True, check=True)
        said = out.stdout.replace("\\", "")
        assert "different numbers of steps" in said and "drop_last" in said, fmt
