"""Good / bad windows for the rules on the evidence of work (SD108 slow-rank, SD109
busy-without-progress) and on exits (SD103 with an unknown status, and after a reported
collective mismatch).

The RankWork figures are those recorded from the real runs of tests/test_stall_decision.py on
this machine: rank 0 writing a checkpoint to slow storage (3 % CPU, 2.8 MB/s) while ranks 1-2 sit
in barrier #7 at 0 % CPU; a rank spinning on a flag at 99 % CPU in one frame."""
from __future__ import annotations

from stalldoc.model.agent import AgentSnapshot
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.model.findings import Severity
from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.model.samples import HostSample
from stalldoc.model.window import Window
from stalldoc.model.work import RankWork
from stalldoc.rules import by_code, run_rules

NOW = 1000.0


def work(verdict: str = "idle", reason: str = "no CPU, I/O, GPU or progress", cpu: float = 0.0,
         io: float = 0.0, since: float = 6.0, frame: str = "", busy: float = 0.0) -> RankWork:
    return RankWork(NOW, verdict, reason, False, cpu, 0, None, io, None,
                    "working" if frame else "", frame, since, busy)


def in_barrier(rank: int, seq: int = 7) -> AgentSnapshot:
    record = CollectiveRecord("world", seq, "barrier", 1, "float32", NOW - 6, None, False)
    return AgentSnapshot(100 + rank, rank, rank, 3, 0, 0.0, NOW, 3, NOW, None, (), "", 0, (),
                         (GroupState("world", seq, seq - 1, (record,)),))


def window(**kw) -> Window:
    ranks = tuple(RankProcess(r, 100 + r, r, ("python",)) for r in range(3))
    return Window(NOW, ranks, floor=3.0, **kw)


CHECKPOINT = {0: work("work", "reading / writing 2.8 MB/s", cpu=3.0, io=2.8e6,
                      frame="save_checkpoint (train.py:114)"),
              1: work(), 2: work()}


def test_sd108_bad_one_rank_writes_a_checkpoint_while_the_others_wait_in_a_barrier():
    [finding] = by_code("SD108")().check(window(work=CHECKPOINT, agents={1: in_barrier(1),
                                                                          2: in_barrier(2)}))
    assert finding.ranks == (0,) and finding.severity is Severity.WARNING
    assert finding.summary == ("rank 0 has been in save_checkpoint (train.py:114) for 6 s without "
                               "progress, reading / writing 2.8 MB/s; ranks 1,2 wait in barrier "
                               "#7 (group world)")
    assert finding.evidence["waiting_ranks"] == [1, 2]
    assert finding.evidence["ranks"]["0"]["io_bps"] == 2.8e6


def test_sd108_good_not_slow_before_the_floor_nor_when_nobody_waits():
    early = {**CHECKPOINT, 0: work("work", "reading / writing 2.8 MB/s", io=2.8e6, since=2.0)}
    assert list(by_code("SD108")().check(window(work=early))) == []
    everyone = {r: work("work", "CPU busy in forward", cpu=99.0, frame="forward (m.py:3)")
                for r in range(3)}
    assert list(by_code("SD108")().check(window(work=everyone))) == []


def test_sd109_bad_spinning_in_one_frame_past_the_busy_timeout():
    spinning = {1: work("work", "CPU busy in wait_until_ready (x.py:9)", cpu=99.0,
                        frame="wait_until_ready (x.py:9)", busy=640.0), 0: work(), 2: work()}
    [finding] = by_code("SD109")().check(window(work=spinning, busy_timeout=600.0))
    assert finding.ranks == (1,) and finding.severity is Severity.WARNING
    assert "busy in the same stack for 640 s" in finding.summary
    assert "rank 1 in wait_until_ready (x.py:9) (99% CPU)" in finding.summary


def test_sd109_good_under_the_busy_timeout():
    spinning = {1: work("work", "CPU busy", cpu=99.0, frame="f (x.py:9)", busy=590.0)}
    assert list(by_code("SD109")().check(window(work=spinning, busy_timeout=600.0))) == []


def test_sd103_exit_zero_is_never_a_finding_and_unknown_is_info():
    clean = (RankExit(1, 101, NOW, 0, None, "proc"),)
    assert [f for f in run_rules(window(exits=clean), "exit") if f.code == "SD103"] == []
    unknown = (RankExit(1, 101, NOW, None, None, "unknown"),)
    [finding] = [f for f in run_rules(window(exits=unknown), "exit") if f.code == "SD103"]
    assert finding.severity is Severity.INFO and finding.ranks == (1,)
    assert "exit status was not seen" in finding.summary


def test_sd103_a_known_failure_outranks_unknown_statuses():
    exits = (RankExit(1, 101, NOW, None, None, "unknown"),
             RankExit(2, 102, NOW + 1, 137, 9, "proc"))
    [finding] = [f for f in run_rules(window(exits=exits), "exit") if f.code == "SD103"]
    assert finding.severity is Severity.CRITICAL and finding.ranks == (2,)


def test_sd103_names_a_rank_that_exited_zero_before_the_failure():
    # gloo: rank 1 ran out of data and exited 0; rank 0's next all_reduce failed ("Connection
    # closed by peer") and torchrun named rank 0 as the root cause
    exits = (RankExit(1, 101, NOW - 3, 0, None, "proc"), RankExit(0, 100, NOW, 1, None, "proc"))
    [finding] = [f for f in run_rules(window(exits=exits), "exit") if f.code == "SD103"]
    assert finding.ranks == (0,)
    assert "rank 1 had exited 0 3 s before it" in finding.summary


GLOO_ABORT = ("  what():  [enforce fail at .../gloo/transport/tcp/pair.cc:456] op.preamble.length <= "
              "op.nbytes. 8 vs 1. Received data size doesn't match expected size. Is there a "
              "distributed collective mismatch in your code?")   # sgl-project/sglang#37909


def test_sd103_a_rank_gloo_aborted_on_a_collective_mismatch_gets_the_mismatchs_fix():
    # gloo's size check aborts the rank that received more than it expected (SIGABRT)
    exits = (RankExit(1, 101, NOW, 134, 6, "proc"),)
    lines = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'", GLOO_ABORT,
             "W1127 torch/distributed/elastic/multiprocessing/api.py Sending process 100 SIGTERM")
    [finding] = [f for f in run_rules(window(exits=exits, log_tail=lines), "exit")
                 if f.code == "SD103"]
    assert "SIGABRT" in finding.summary and finding.ranks == (1,)
    assert "native crash" not in finding.fix and "same shape" in finding.fix
    assert finding.evidence["mismatch_line"] == GLOO_ABORT.strip()


def test_sd103_a_native_crash_or_an_oom_kill_keeps_its_own_fix():
    abort = (RankExit(1, 101, NOW, 134, 6, "proc"),)
    crash = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'",
             "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
             "closed by peer [127.0.0.1]:29500")
    [finding] = [f for f in run_rules(window(exits=abort, log_tail=crash), "exit")
                 if f.code == "SD103"]
    assert "native crash" in finding.fix and "mismatch_line" not in finding.evidence
    killed = (RankExit(1, 101, NOW, 137, 9, "proc"),)
    [finding] = [f for f in run_rules(window(exits=killed, log_tail=(GLOO_ABORT,)), "exit")
                 if f.code == "SD103"]
    assert "OOM killer" in finding.fix and "mismatch_line" not in finding.evidence


def test_sd110_bad_the_others_wait_in_a_collective_a_rank_that_ended_never_reached():
    exits = (RankExit(1, 101, NOW - 4, 0, None, "proc"),)
    agents = {0: in_barrier(0, seq=5), 2: in_barrier(2, seq=5)}
    gone = AgentSnapshot(101, 1, 1, 3, 1, 0.0, NOW - 4, 3, NOW - 4, 0, (), "", 0, (),
                         (GroupState("world", 4, 4, ()),))
    [finding] = by_code("SD110")().check(window(exits=exits, agents={**agents, 1: gone}))
    assert finding.ranks == (1,) and finding.severity is Severity.ERROR
    assert finding.summary == ("ranks 0,2 wait in barrier #5 (group world) that rank 1 never "
                               "reached: rank 1 (pid 101) exited with status 0 4 s ago")


def test_sd110_good_a_rank_that_ended_after_the_collective_the_others_wait_in():
    exits = (RankExit(1, 101, NOW - 4, 0, None, "proc"),)
    agents = {0: in_barrier(0, seq=5), 2: in_barrier(2, seq=5)}
    done = AgentSnapshot(101, 1, 1, 3, 1, 0.0, NOW - 4, 3, NOW - 4, 0, (), "", 0, (),
                         (GroupState("world", 5, 5, ()),))
    assert list(by_code("SD110")().check(window(exits=exits, agents={**agents, 1: done}))) == []


def test_sd103_memory_is_the_living_processs_not_what_its_exit_released():
    # GIVEN rank 2 killed (SIGKILL) after growing from 200 to 500 MiB: the ticks in its exit
    # read 0 bytes, first while it tears its memory down (still "running"), then as a zombie
    mib = 2**20
    host = {2: tuple(HostSample(NOW - 10 + i, 2, 102, 1.0 + i, rss, 40, status, 8 << 30)
                     for i, (rss, status) in enumerate([(200 * mib, "running"),
                                                        (500 * mib, "running"),
                                                        (0, "running"), (0, "zombie")]))}
    exits = (RankExit(2, 102, NOW, -9, 9, "proc"),)
    [finding] = [f for f in run_rules(window(exits=exits, host=host), "exit")
                 if f.code == "SD103"]
    # THEN its memory is what the living process held, first to last
    assert finding.evidence["rss_bytes_first_last"] == [200 * mib, 500 * mib]
    assert finding.evidence["last_rss_bytes"] == 500 * mib
