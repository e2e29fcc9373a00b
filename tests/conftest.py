"""Fixtures, and how the suite is spread over pytest-xdist's workers; the helpers live in
support.py."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from durations import expected_seconds
from support import Result, watch

SHARED_SCOPES = ("module", "package", "session")


@pytest.fixture
def run_watch(tmp_path: Path):
    def _run(command: list[str], *options: str, **kwargs: Any) -> Result:
        return watch(tmp_path, command, *options, **kwargs)
    return _run


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the CPUs this process may use. Most real-job tests
    spend much of their time waiting for a stall timeout to pass, which leaves a CPU free."""
    return len(os.sched_getaffinity(0)) + 1


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
    fixture that runs one at a time, else None."""
    if _shares_a_run(item):
        return item.nodeid.split("::")[0]
    return next((ONE_AT_A_TIME[name] for name in getattr(item, "fixturenames", ())
                 if name in ONE_AT_A_TIME), None)


def _units(items: list[pytest.Item]) -> list[tuple[str | None, list[pytest.Item]]]:
    """The items as units that stay together and in their order, each with its xdist group:
    the tests of a group (a module's that share a run, or those of a fixture that runs one at
    a time) are one unit; every other test is a unit of its own, with no group."""
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
    return units


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the groups into the nodeids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In pytest-xdist's workers (``-n``): a module whose tests share a run goes to one worker as
    one group (its run is made once), so do the tests of a fixture in ONE_AT_A_TIME, and the
    longest tests start first, so that no long test is left for the end while the other workers
    are done. A run without ``-n`` keeps the order.
    (The workers collect; each sorts alike, as xdist requires of them.)"""
    if not hasattr(config, "workerinput"):
        return
    units = _units(items)
    for group, unit in units:
        if group is not None:
            for item in unit:
                item.add_marker(pytest.mark.xdist_group(group))
    cost = expected_seconds()
    units.sort(key=lambda unit: -sum(cost.get(item.nodeid, 0.0) for item in unit[1]))
    items[:] = [item for _, unit in units for item in unit]
