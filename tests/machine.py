"""Which tests share the machine under pytest-xdist, and which have it to themselves.

A test that loads the machine on purpose (its CPU burner, a core it starves) runs *alone*: no
other worker's test runs while it does, so its load is the load it was written for, and the
tests beside it are not run on a machine loaded twice over. Every other test runs *beside* the
other workers' tests. One lock for the whole machine, between the workers' processes:

- beside: pass the gate, then hold the machine shared for the test;
- alone: hold the gate (no new test starts beside), then the machine exclusively, once the tests
  already running beside have ended.

The gate keeps a test that waits to run alone from waiting for good while the other workers
start one test after another. Without pytest-xdist (a serial run) nothing is locked: each test
has the machine anyway."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Iterator

# the lock's files: one pair per user and machine (a test of the lock names its own)
_PREFIX = Path(os.environ.get("STALLDOC_TESTS_MACHINE")
               or Path(tempfile.gettempdir()) / f"stalldoc-tests-machine-{os.getuid()}")
GATE, MACHINE = Path(f"{_PREFIX}.gate"), Path(f"{_PREFIX}.lock")
ALONE = "STALLDOC_TESTS_ALONE"   # set in a worker while its test runs alone


def in_worker() -> bool:
    """Whether this process is one of pytest-xdist's workers (a parallel run)."""
    return "PYTEST_XDIST_WORKER" in os.environ


@contextlib.contextmanager
def _locked(path: Path, how: int) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, how)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def held(alone: bool) -> Iterator[None]:
    """The machine held for one test: exclusively (``alone``) or shared with the other workers'
    tests. A no-op outside pytest-xdist's workers."""
    if not in_worker():
        yield
        return
    if alone:
        with _locked(GATE, fcntl.LOCK_EX), _locked(MACHINE, fcntl.LOCK_EX):
            os.environ[ALONE] = "1"
            try:
                yield
            finally:
                os.environ.pop(ALONE, None)
        return
    with contextlib.ExitStack() as shared:
        with _locked(GATE, fcntl.LOCK_EX):
            shared.enter_context(_locked(MACHINE, fcntl.LOCK_SH))
        yield


def assert_alone(what: str) -> None:
    """Fail a test that loads the machine without having it to itself (in a parallel run): it
    would load the other workers' tests too, and its own load would not be the one it meant."""
    if in_worker() and os.environ.get(ALONE) != "1":
        raise AssertionError(
            f"{what} in a test that does not run alone: mark it @pytest.mark.alone "
            "(or parametrize it with loaded=True), see tests/machine.py")
