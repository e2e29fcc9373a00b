"""SD537 vendor-hang-verdict beyond its fixture file: NVRx's rank monitor in the logger prefixes
of its versions (0.2 as NeMo's guide shows its output, 0.4.1 as it printed here), its section
verdicts as 0.4.1's source words them, and HCCL's lost heartbeat with its discoverer (Ascend's
torch_npu troubleshooting case of 2024-11-28)."""
from __future__ import annotations

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import by_code

NVRX = "NVIDIA Resiliency Extension's rank monitor"


def found(*lines: str):
    window = Window(100.0, (), log=tuple(LogLine(99.0, "stderr", line) for line in lines))
    return list(by_code("SD537")().check(window))


def test_nemo_guides_two_ranks_in_the_old_prefix():
    [finding] = found("[WARNING] [RankMonitorServer:34] Did not get subsequent heartbeat. "
                      "Waited 171.92 seconds.",
                      "[WARNING] [RankMonitorServer:58] Did not get subsequent heartbeat. "
                      "Waited 171.92 seconds.",
                      "torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process "
                      "453152 closing signal SIGTERM")
    assert finding.evidence["monitor_ranks"] == [34, 58] and finding.ranks == ()
    assert finding.evidence["count"] == 2        # the launcher's SIGTERM is no verdict
    assert finding.summary == (f"{NVRX} declared ranks 34,58 hung: no subsequent heartbeat in "
                               "171.92 s; it ends the rank")


def test_a_rank_that_never_sent_its_first_heartbeat():
    [finding] = found("[2026-11-28 16:07:40,101] [WARNING] [RankMonServer15531@vm:3] Did not "
                      "get initial heartbeat. Waited 60.00 seconds.")
    assert finding.evidence["heartbeat"] == "initial"
    assert finding.summary.startswith(f"{NVRX} declared rank 3 hung: no initial heartbeat in "
                                      "60.00 s")


def test_section_verdicts_say_the_section_and_its_timeout():
    [open_too_long] = found("[2026-11-28 16:09:02,514] [WARNING] [RankMonServer15531@vm:0] "
                            "Section 'checkpointing' has been open for 312.40 seconds. Timeout "
                            "is 300.00 seconds.")
    assert open_too_long.evidence["section"] == "checkpointing"
    assert ("rank 0 hung: section 'checkpointing' open for 312.40 s (timeout 300.00 s)"
            in open_too_long.summary)
    [outside] = found("[2026-11-28 16:09:02,514] [WARNING] [RankMonServer15532@vm:1] Was out "
                      "of section for 95.10 seconds. Timeout is 90.00 seconds.")
    assert "rank 1 hung: out of every section for 95.10 s (timeout 90.00 s)" in outside.summary


def test_hccl_names_the_rank_that_lost_its_heartbeat_and_who_found_it():
    [finding] = found("    Cluster Exception Location[IP/ID]:[90.90.92.240/1], Arrival Time:[Thu "
                      "Nov 28 11:56:34 2024], Discoverer:[90.90.92.240/0], ExceptionType:"
                      "[Heartbeat Lost Occurred], Possible Reason:1. Process has exited, 2. "
                      "Network Disconnected")
    assert finding.evidence["discoverer"] == "90.90.92.240/0" and finding.ranks == ()
    assert finding.summary == ("Huawei HCCL's cluster heartbeat says the heartbeat of the rank "
                               "at 90.90.92.240/1 is lost (found by 90.90.92.240/0): its process "
                               "exited or its network is down")
