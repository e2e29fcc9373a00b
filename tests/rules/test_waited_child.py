"""The child a waiting rank is described by: the first whose stack is in code of its own. A
child that runs only library code under a ``python -c`` bootstrap (multiprocessing's resource
tracker, which every spawn-started job has; a spawned process in a library's wait) says nothing
of the rank's wait and is passed over (seen naming the resource tracker, ``<module>
(<string>:1)``, for a rank waiting on the pipes of its SGLang schedulers)."""
from __future__ import annotations

from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.window import Window
from stalldoc.rules.base import waited_child

LIB = "/usr/lib/python3.11"
WAITS_ON_PIPE = (Frame("Connection._recv", f"{LIB}/multiprocessing/connection.py", 395),
                 Frame("_ConnectionBase.recv", f"{LIB}/multiprocessing/connection.py", 250),
                 Frame("main", "/job/host.py", 56))
RESOURCE_TRACKER = (Frame("main", f"{LIB}/multiprocessing/resource_tracker.py", 209),
                    Frame("<module>", "<string>", 1))
SPAWNED_IN_LIBRARY = (Frame("Condition.wait", f"{LIB}/threading.py", 320),
                      Frame("BaseProcess._bootstrap", f"{LIB}/multiprocessing/process.py", 314),
                      Frame("_main", f"{LIB}/multiprocessing/spawn.py", 135),
                      Frame("spawn_main", f"{LIB}/multiprocessing/spawn.py", 122),
                      Frame("<module>", "<string>", 1))
WORKER = (Frame("score", "/job/reward.py", 40),
          Frame("BaseProcess.run", f"{LIB}/multiprocessing/process.py", 108),
          Frame("_main", f"{LIB}/multiprocessing/spawn.py", 135),
          Frame("<module>", "<string>", 1))


def _stacks(rank: int, pid: int, frames: tuple[Frame, ...]) -> RankStacks:
    return RankStacks(rank, pid, 0.0, "py-spy", (ThreadStack(pid, "MainThread", False, False,
                                                             frames),))


def _window(*children: tuple[int, tuple[Frame, ...]]) -> Window:
    return Window(10.0, (RankProcess(0, 100, None, ("python", "host.py"), False, ""),),
                  stacks={0: _stacks(0, 100, WAITS_ON_PIPE)},
                  children={0: tuple(_stacks(0, pid, frames) for pid, frames in children)})


def test_the_resource_tracker_is_passed_over_for_the_child_in_code_of_its_own() -> None:
    child = waited_child(_window((101, RESOURCE_TRACKER), (102, SPAWNED_IN_LIBRARY),
                                 (103, WORKER)), 0)
    assert child is not None and child["pid"] == 103 and child["frame"].startswith("score (")


def test_children_in_library_code_alone_name_none() -> None:
    assert waited_child(_window((101, RESOURCE_TRACKER), (102, SPAWNED_IN_LIBRARY)), 0) is None
