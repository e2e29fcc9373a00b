"""One bad sample never stops watching: a real torchrun job hangs while a process beside its ranks
has a RANK beyond 64 bits and the agents directory holds crafted files; the hang is still found
and its culprit named."""
from __future__ import annotations

import pytest

from support import torchrun

pytestmark = pytest.mark.timeout(180)

# before the launcher starts: a FIFO, a directory and empty files named like state files (of a
# pid no process has, of a negative one, of one beyond 64 bits), and a process of the job whose
# RANK no job has
CRAFT = ('(cd "$STALLDOC_AGENT_DIR" && mkfifo agent-4194303.state && mkdir agent-4194302.state'
         ' && : > agent--5.state && : > agent-99999999999999999999.state)'
         '; RANK=99999999999999999999 LOCAL_RANK=-1 sleep 600 & exec "$@"')


def test_a_hang_is_found_among_bad_samples(run_watch):
    # GIVEN rank 1 of a 2-rank torchrun job stuck outside the collective rank 0 waits in
    env = {"STUCK_RANK": "1", "STUCK_FUNC": "fetch_batch", "OP": "all_reduce"}
    command = ["sh", "-c", CRAFT, "sh", *torchrun(2, "collective_wait.py")]
    # WHEN it is watched among the bad samples
    result = run_watch(command, "--on-stall", "kill", env=env)
    # THEN the stall is diagnosed as without them: rank 1 named, in its frame
    assert result.code == 124, result.stderr
    [finding] = result.findings("SD101")
    assert finding["ranks"] == [1] and finding["evidence"]["frame"].startswith("fetch_batch (")
    assert sorted(r["rank"] for r in result.report()["ranks"]) == [0, 1]
    # AND the watcher never stopped nor waited on a file
    assert "internal error" not in result.stderr and "did not finish" not in result.stderr
    assert not (result.run_dir / "stalldoc-errors.log").exists()
    sidecar_log = result.run_dir / "sidecar.log"
    assert not sidecar_log.exists() or "Traceback" not in sidecar_log.read_text()
