"""Good / bad windows for SD116 extension-build-lock. The frames are those py-spy read from the
ranks of a DeepSpeed ZeRO-3 job asleep on its shared-memory op's build lock (torch 2.13,
deepspeed 0.19), and as faulthandler names them."""
from __future__ import annotations

from stalldoc.model.findings import Severity
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import BuildLock, Frame, RankStacks, ThreadStack
from stalldoc.model.window import Window
from stalldoc.rules import by_code, run_rules

NOW = 100_000.0
SITE = "/venv/lib/python3.11/site-packages"
LOCK = "/home/me/.cache/torch_extensions/py311_cu121/deepspeed_shm_comm/lock"
IN_BATON = (Frame("FileBaton.wait", f"{SITE}/torch/utils/file_baton.py", 50),
            Frame("_jit_compile", f"{SITE}/torch/utils/cpp_extension.py", 2400),
            Frame("load", f"{SITE}/torch/utils/cpp_extension.py", 1927),
            Frame("OpBuilder.jit_load", f"{SITE}/deepspeed/ops/op_builder/builder.py", 613),
            Frame("OpBuilder.load", f"{SITE}/deepspeed/ops/op_builder/builder.py", 566),
            Frame("build_shm_op", f"{SITE}/deepspeed/comm/torch.py", 51),
            Frame("init_distributed", f"{SITE}/deepspeed/comm/comm.py", 880),
            Frame("setup", "/job/train_grpo.py", 68))
IN_BARRIER = (Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4800),
              Frame("setup", "/job/train_grpo.py", 70))


def stacks(rank: int, frames: tuple[Frame, ...], method: str = "py-spy") -> RankStacks:
    return RankStacks(rank, 100 + rank, NOW, method,
                      (ThreadStack(100 + rank, "MainThread", False, False, frames),))


def window(frames: dict[int, tuple[Frame, ...]], locks: tuple[BuildLock, ...] = (),
           method: str = "py-spy") -> Window:
    ranks = tuple(RankProcess(r, 100 + r, r, ("python",)) for r in range(len(frames)))
    return Window(NOW, ranks, floor=3.0, build_locks=locks,
                  stacks={r: stacks(r, f, method) for r, f in frames.items()})


def check(win: Window) -> list:
    return list(by_code("SD116")().check(win))


def test_a_lock_nobody_builds_is_an_error_naming_the_file():
    # GIVEN 3 ranks asleep on the op's lock, written 20 min ago, no process in its directory
    win = window({r: IN_BATON for r in range(3)}, (BuildLock(LOCK, 1200.0, ()),))
    [finding] = check(win)
    assert finding.ranks == (0, 1, 2) and finding.severity is Severity.ERROR
    assert finding.summary.startswith(
        "ranks 0-2 wait for the build lock of torch C++ extension deepspeed_shm_comm, which no "
        f"process is building: left by a build that was stopped; its lock is {LOCK} (written "
        "20 min ago); loaded from OpBuilder.jit_load ("), finding.summary
    assert "in setup (/job/train_grpo.py:68)" in finding.summary
    assert finding.evidence["locks"] == [{"path": LOCK, "age": 1200.0, "builders": [],
                                          "leftovers": []}]
    assert "delete the `lock` file" in finding.fix
    # AND it explains the stall: no SD106 beside it
    assert [f.code for f in run_rules(win, "stall")] == ["SD116"]


def test_compilers_left_by_a_killed_build_do_not_make_it_a_build_in_progress():
    # GIVEN the job's build killed with its process group 24 s ago: torch and ninja are gone,
    # two compilers ninja had started in groups of their own still run in the directory
    win = window({0: IN_BATON, 1: IN_BATON}, (BuildLock(LOCK, 24.0, (), (8643, 8647)),))
    [finding] = check(win)
    assert finding.severity is Severity.ERROR
    assert (f"which no process is building: left by a build that was stopped; its lock is {LOCK} "
            "(written 24 s ago; its compilers still run there, pid(s) 8643, 8647, with no ninja, "
            "and end without removing it)") in finding.summary, finding.summary
    assert finding.evidence["locks"][0]["leftovers"] == [8643, 8647]
    assert "compilers a stopped build left end by themselves" in finding.fix


def test_a_build_in_progress_is_a_warning_naming_the_builders():
    # GIVEN another job's ninja (pid 4242) building in the lock's directory
    [finding] = check(window({0: IN_BATON, 1: IN_BATON}, (BuildLock(LOCK, 40.0, (4242,)),)))
    assert finding.severity is Severity.WARNING
    assert "the build of torch C++ extension deepspeed_shm_comm by pid(s) 4242" in finding.summary
    assert "written 40 s ago" in finding.summary
    assert "own `TORCH_EXTENSIONS_DIR`" in finding.fix


def test_a_lock_not_found_is_still_said_as_the_wait_it_is():
    # GIVEN the waiting ranks' extension root unreadable (or a build_directory of the caller's)
    [finding] = check(window({0: IN_BATON, 1: IN_BARRIER}))
    assert finding.ranks == (0,) and finding.severity is Severity.ERROR
    assert "not found under their extension root" in finding.summary


def test_faulthandler_frames_are_read_alike():
    # faulthandler names functions without their class
    frames = (Frame("wait", IN_BATON[0].filename, 50),) + IN_BATON[1:]
    [finding] = check(window({0: frames}, (BuildLock(LOCK, 5.0, ()),), method="faulthandler"))
    assert finding.ranks == (0,)


def test_ranks_in_a_collective_or_in_torch_code_elsewhere_are_not_named():
    wait_elsewhere = (Frame("wait", f"{SITE}/torch/utils/data/_utils/signal_handling.py", 9),
                      Frame("setup", "/job/train_grpo.py", 70))
    assert check(window({0: IN_BARRIER, 1: wait_elsewhere}, (BuildLock(LOCK, 5.0, ()),))) == []
