"""stalldoc watch with torch's Flight Recorder: a hang inside a collective the agent does not wrap
(DDP's reducer all-reduce, issued from C++) is aligned from the ranks' dumps, and the dumps are
left where torchfrtrace reads them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from support import torchrun, watch

pytestmark = pytest.mark.timeout(180) if hasattr(pytest.mark, "timeout") else []

PRINT_ENV = ("import os; print([os.environ.get(n) for n in ('TORCH_FR_BUFFER_SIZE', "
             "'TORCH_FR_DUMP_TEMP_FILE', 'STALLDOC_FLIGHT_DIR')])")


def test_ddp_hang_is_named_from_the_flight_recorder(run_watch):
    # GIVEN DDP on 3 ranks where rank 2 never returns from load_shard, so ranks 0 and 1 wait
    # in the reducer's all_reduce inside backward(): the agent's rings show nothing pending
    result = run_watch(torchrun(3, "ddp_wait.py"), "--on-stall", "kill",
                       env={"STUCK_RANK": "2", "STUCK_STEP": "2"})
    assert result.code == 124, result.stderr
    # THEN SD101 names rank 2, from the Flight Recorder, with the collective and both frames
    [finding] = result.findings("SD101")
    evidence = finding["evidence"]
    assert finding["ranks"] == [2]
    assert evidence["source"] == "flight_recorder"
    assert (evidence["group"], evidence["group_desc"], evidence["op"]) == ("0", "default_pg",
                                                                           "all_reduce")
    assert evidence["waiting_ranks"] == [0, 1] and evidence["missing_ranks"] == [2]
    assert evidence["collective_frame"].startswith("main (") and "ddp_wait.py" in \
        evidence["collective_frame"]
    # (DDP imports torch._inductor, so the dumps hold the frames where the all_reduce was issued)
    assert evidence["collective_frame_from"] == "flight_recorder"
    assert any(f.startswith("backward (") for f in evidence["waiting_at"]["0"]["frames"])
    assert evidence["frame"].startswith("load_shard (")
    assert f"#{evidence['seq']}" in finding["summary"]
    # AND no cause is claimed: rank 2 is in no collective at all (its own code holds it), so the
    # Flight Recorder shows nothing it was doing instead
    assert "cause" not in evidence and "uneven" not in finding["summary"], evidence
    # AND the dumps are in the run directory, listed in the report, in torch's layout
    report = result.report()
    assert report["flight_dumps"] == ["flight/rank_0", "flight/rank_1", "flight/rank_2"]
    assert report["run"]["flight_recorder"]["set"]["TORCH_FR_BUFFER_SIZE"] == "2000"
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                          str(result.run_dir / "flight")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    said = out.stdout + out.stderr
    assert f"Not all ranks joining collective, sequence number: {evidence['seq']}" in said
    assert "missing ranks: {2}" in said


@pytest.mark.parametrize("options,expected", [
    ((), "['2000', '{run}/flight/rank_', '{run}/flight']"),
    (("--no-flight-recorder",), "[None, None, None]"),
    (("--no-agent",), "[None, None, None]"),
])
def test_opt_out_and_no_agent_leave_the_jobs_environment_alone(tmp_path, options, expected):
    result = watch(tmp_path, [sys.executable, "-c", PRINT_ENV], *options)
    assert result.code == 0, result.stderr
    assert expected.format(run=result.run_dir) in result.stdout
    enabled = result.report()["run"]["flight_recorder"]["enabled"]
    assert enabled == (not options)


def test_the_users_buffer_size_is_kept(tmp_path):
    result = watch(tmp_path, [sys.executable, "-c", PRINT_ENV],
                   env={"TORCH_FR_BUFFER_SIZE": "77"})
    assert result.code == 0, result.stderr
    assert "['77', " in result.stdout
    assert result.report()["run"]["flight_recorder"]["user_set"] == ["TORCH_FR_BUFFER_SIZE"]
