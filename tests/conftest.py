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


def _units(items: list[pytest.Item]) -> list[tuple[str | None, list[pytest.Item]]]:
    """The items as units that stay together and in their order, each with its xdist group: the
    tests of a module that share a run are one unit, grouped under the module's path; every
    other test is a unit of its own, with no group."""
    units: list[tuple[str | None, list[pytest.Item]]] = []
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        if not _shares_a_run(item):
            units.append((None, [item]))
            continue
        module = item.nodeid.split("::")[0]
        if module not in by_module:
            by_module[module] = []
            units.append((module, by_module[module]))
        by_module[module].append(item)
    return units


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the groups into the nodeids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In pytest-xdist's workers (``-n``): a module whose tests share a run goes to one worker as
    one group (its run is made once), and the longest tests start first, so that no long test is
    left for the end while the other workers are done. A run without ``-n`` keeps the order.
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
