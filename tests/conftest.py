"""Fixtures, and how the suite is spread over pytest-xdist's workers; the helpers live in
support.py."""
from __future__ import annotations

import compileall
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

import machine
from durations import expected_seconds
from support import Result, watch

SHARED_SCOPES = ("module", "package", "session")


@pytest.fixture
def run_watch(tmp_path: Path):
    def _run(command: list[str], *options: str, **kwargs: Any) -> Result:
        return watch(tmp_path, command, *options, **kwargs)
    return _run


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode for stalldoc and the scenarios' modules, written once before the workers start:
    with PYTHONDONTWRITEBYTECODE set (as on this project's machines) no process writes it, and
    every watcher, agent and CLI call the tests start would compile stalldoc's modules again
    (0.16 s of CPU a watcher, thousands of processes). compileall writes it whatever that
    variable says; a checkout that has it already is left as it is."""
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parents[1]
    for folder in (root / "stalldoc", root / "tests" / "scenarios"):
        compileall.compile_dir(str(folder), quiet=2)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker per CPU this process may use, two at least. The suite is bound by
    CPU (real jobs importing torch): on 2 cores a third worker only loaded the timing-sensitive
    tests more (docs/index.md), while a second fills the time each test waits for a stall."""
    return max(2, len(os.sched_getaffinity(0)))


def _shares_a_run(item: pytest.Item) -> bool:
    """Whether the test uses a module- or session-scoped fixture of this suite (one expensive
    real run that several tests assert on)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        definition.scope in SHARED_SCOPES and definition.baseid
        for definitions in info.name2fixturedefs.values() for definition in definitions)


# Fixtures whose tests run one at a time, on one worker: each test with ``ray_env`` starts a
# Ray cluster of its own (a GCS, a raylet, a dashboard, 2-4 workers importing torch). In a clean
# clone's CI, three of them at once beside the CPU burner on 2 cores ran past 360 s each.
ONE_AT_A_TIME = {"ray_env": "ray_clusters"}


def _group(item: pytest.Item) -> str | None:
    """The xdist group of a test: its module's path when it shares a run, the group of a
    fixture that runs one at a time (unless the test runs alone: then nothing runs beside it
    anyway, and in the group it would hold a worker to the group's other tests), else None."""
    if _shares_a_run(item):
        return item.nodeid.split("::")[0]
    if runs_alone(item):
        return None
    return next((ONE_AT_A_TIME[name] for name in getattr(item, "fixturenames", ())
                 if name in ONE_AT_A_TIME), None)


def _units(items: list[pytest.Item]) -> list[tuple[str | None, list[pytest.Item]]]:
    """The items as units that stay together, each with its xdist group: the tests of a group
    (a module's that share a run, or those of a fixture that runs one at a time) are one unit,
    those that run alone first, the others in their order; every other test is a unit of its
    own, with no group. (A worker in a group's test beside the others holds the other worker
    from its next test that runs alone, and the reverse: each change between the two costs a
    test's time.)"""
    units: list[tuple[str | None, list[pytest.Item]]] = []
    by_group: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = _group(item)
        if group is None:
            units.append((None, [item]))
            continue
        if group not in by_group:
            by_group[group] = []
            units.append((group, by_group[group]))
        by_group[group].append(item)
    for _, unit in units:   # a group's tests that run alone first, while the others' do too
        unit.sort(key=lambda item: not runs_alone(item))
    return units


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the groups into the nodeids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In pytest-xdist's workers (``-n``): a module whose tests share a run goes to one worker as
    one group (its run is made once), so do the tests of a fixture in ONE_AT_A_TIME; the tests
    that run alone start first, then the longest, so that no long test is left for the end
    while the other workers are done. A run without ``-n`` keeps the order.
    (The workers collect; each sorts alike, as xdist requires of them.)"""
    if not hasattr(config, "workerinput"):
        return
    units = _units(items)
    for group, unit in units:
        if group is not None:
            for item in unit:
                item.add_marker(pytest.mark.xdist_group(group))
    cost = expected_seconds()
    units.sort(key=lambda unit: _order(unit[1], cost))
    items[:] = [item for _, unit in units for item in unit]


def _order(unit: list[pytest.Item], cost: dict[str, float]) -> tuple[bool, bool, float]:
    """Where a unit goes: those of a real vLLM after all the others (on a fresh machine its
    virtualenv builds meanwhile, at the lowest priority, on the CPU the tests beside each other
    leave idle), and in each part the units with a test that runs alone first (two workers that
    both wait to run alone lose nothing; a worker that waits for the machine while the other
    runs a test beside loses that test's time), then the longest first."""
    alone = any(runs_alone(item) for item in unit)
    engine = any(hasattr(getattr(item, "module", None), "vllm_env") for item in unit)
    return (engine, not alone, -sum(cost.get(item.nodeid, 0.0) for item in unit))


def pytest_collection_finish(session: pytest.Session) -> None:
    """When tests of a real vLLM are to run, its virtualenv starts building at once, in the
    background, if it is not built (tests/vllm_env.py): the tests before them run meanwhile."""
    modules = {getattr(item, "module", None) for item in session.items}
    if any(hasattr(module, "vllm_env") for module in modules):
        sys.modules["vllm_env"].build_in_background()


# a parametrization that loads the machine: ``loaded=True``, or an id that says so (a shared
# run's fixture parametrized with its load)
LOADED_ID = re.compile(r"(^|-)(loaded|cpu-burner)(-|$)")


def runs_alone(item: pytest.Item) -> bool:
    """Whether the test loads the machine on purpose and so runs with no other test beside it
    (tests/machine.py): marked ``alone``, or parametrized with its load."""
    if item.get_closest_marker("alone") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and (callspec.params.get("loaded") is True
                                     or LOADED_ID.search(callspec.id) is not None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)   # around pytest-timeout's timer
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """In pytest-xdist's workers, each test holds the machine: alone, or beside the others.
    With STALLDOC_TESTS_TIMELINE set, each test's worker, start, end (the lock waited for
    included) and whether it ran alone are appended to that file, to see where a run's time
    went."""
    alone, started, before = runs_alone(item), time.time(), _children()
    with machine.held(alone):
        yield
    timeline = os.environ.get("STALLDOC_TESTS_TIMELINE")
    if timeline:
        left = sorted(set(_children()) - set(before))
        with open(timeline, "a", encoding="utf-8") as out:
            out.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {started:.1f} "
                      f"{time.time():.1f} {int(alone)} {item.nodeid}"
                      f"{' left=' + ','.join(left) if left else ''}\n")


def _children() -> list[str]:
    """This worker's children, a zombie's pid marked Z: a test's processes still there after it
    (its module's shared run, or a leak) are named in the timeline."""
    return [f"{kid.pid}{'Z' if status == psutil.STATUS_ZOMBIE else ''}"
            for kid in psutil.Process().children() if (status := _status(kid)) is not None]


def _status(proc: psutil.Process) -> str | None:
    try:
        return proc.status()
    except psutil.Error:
        return None


@pytest.fixture
def ray_env() -> Iterator[dict[str, str]]:
    """Ray kept to itself: its session files in a short private directory (socket paths have a
    length limit), no token file in $HOME, no usage report. Ray Train may take as long as it
    needs to start its workers: on 2 cores under the CPU burner, importing torch in 3 workers
    took over the default 60 s, and Ray Train then retries the start for good
    (``controller_failure_limit=-1``), a hang of Ray's making, not the job's (users of a loaded
    node raise the same variable). Ray's workers run at its default niceness 15 unless told
    otherwise, and beside the CPU burner's spinners at niceness 0 they got about 3 % of a core
    each (CFS weights 36 against 1024): on CI's slower machine the trainer had not trained a step
    in 360 s. ``RAY_worker_niceness=0``, as Ray's own job submission sets for its entrypoints,
    puts them on the footing every other job in these tests has: half the cores."""
    pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    yield {"RAY_TMPDIR": temp, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_DEDUP_LOGS": "0", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "300",
           "RAY_worker_niceness": "0"}
    shutil.rmtree(temp, ignore_errors=True)
