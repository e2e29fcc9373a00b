"""``stalldoc report`` reads finished, live, killed and copied runs without writing into them,
and says in one line (exit 1) what it cannot read: a damaged database, a missing table, bad
JSON, a directory it may not enter. Hypothesis damages a real run database at random."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from support import synthetic_tick
from stalldoc.cli import main
from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.work import StallEpisode
from stalldoc.report.build import build_report
from stalldoc.store.db import RunStore

T0 = 1_700_000_000.0
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _store(run_dir: Path, seconds: int = 30) -> RunStore:
    store = RunStore(run_dir)
    store.start_run(run_dir.name, ["swift", "rlhf"], "node", T0, 45, True)
    for i in range(seconds):
        store.add_tick(synthetic_tick(T0 + i, 2, 1, "rollout"))
    store.save_stall(StallEpisode(1, T0 + 5, T0 + 20, 15, (0, 1)))
    store.put_findings(Ledger().stall(T0 + 20, 1, [Finding(
        "SD101", "rank-outside-collective", Severity.ERROR, (1,), "rank 1 not in all_reduce #7",
        {"frames": ["load (data.py:18)"]}, "look")]).entries)
    store.add_logs([LogLine(T0, "stdout", "global_step 1/10")])
    store.commit()
    return store


def _run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = _store(run_dir)
    store.end_run(T0 + 30, 0)
    store.close()
    return run_dir


def _report(run_dir: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "stalldoc", "report", str(run_dir),
                           "--format", "json"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _one_line_failure(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_a_finished_run_is_read_without_leaving_files(tmp_path):
    run_dir = _run(tmp_path)
    before = sorted(os.listdir(run_dir))
    result = _report(run_dir)
    assert result.returncode == 0 and '"rank 1 not in all_reduce #7"' in result.stdout
    assert sorted(os.listdir(run_dir)) == before == ["run.db"]


def test_a_live_run_is_read_while_the_watcher_writes(tmp_path):
    store = _store(tmp_path)
    before = sorted(os.listdir(tmp_path))
    result = _report(tmp_path)
    assert result.returncode == 0 and '"SD101"' in result.stdout
    assert sorted(os.listdir(tmp_path)) == before == ["run.db", "run.db-shm", "run.db-wal"]
    store.close()


KILLED_WRITER = """
import sys, time
from pathlib import Path
sys.path[:0] = {path!r}
from test_reader import _store
store = _store(Path({run_dir!r}))
print("written", flush=True)
time.sleep(60)
"""


def _killed_writer(run_dir: Path) -> None:
    """A watcher's store in ``run_dir``, its writer killed with SIGKILL after its writes."""
    code = KILLED_WRITER.format(path=[str(Path(__file__).parent), *sys.path],
                                run_dir=str(run_dir))
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          text=True) as writer:
        assert writer.stdout is not None and writer.stdout.readline() == "written\n"
        writer.kill()


def _digests(run_dir: Path) -> dict[str, str]:
    import hashlib
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir())}


def test_a_killed_run_is_read_and_left_byte_for_byte_as_it_was(tmp_path):
    # GIVEN a watcher killed with SIGKILL after its writes: run.db, its -wal and -shm left,
    # nobody holding them
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _killed_writer(run_dir)
    before = _digests(run_dir)
    assert sorted(before) == ["run.db", "run.db-shm", "run.db-wal"]
    # WHEN it is reported, twice
    for _ in range(2):
        result = _report(run_dir)
        assert result.returncode == 0 and '"SD101"' in result.stdout, result.stderr  # in the WAL
    # THEN every file is as it was, byte for byte
    assert _digests(run_dir) == before


def test_a_killed_run_copied_without_its_shared_memory_file_keeps_its_last_writes(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    store = _store(live)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("run.db", "run.db-wal"):   # what a copy taken after a crash may hold
        shutil.copyfile(live / name, copy / name)
    result = _report(copy)
    assert result.returncode == 0 and '"SD101"' in result.stdout   # only in the WAL
    assert sorted(os.listdir(copy)) == ["run.db", "run.db-wal"]
    store.close()


@pytest.fixture
def shared_tmp():
    """A directory another user may enter (pytest's own is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="stalldoc-reader-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _as_nobody_possible() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.mark.skipif(not _as_nobody_possible(), reason="needs root and setpriv to read as nobody")
def test_a_read_only_copy_is_read_by_another_user(tmp_path, shared_tmp):
    run_dir = shared_tmp / "copy"
    shutil.copytree(_run(tmp_path), run_dir)
    for path in (run_dir / "run.db", run_dir):
        path.chmod(0o444 if path.is_file() else 0o555)
    result = _report(run_dir, *NOBODY)
    assert result.returncode == 0, result.stderr
    assert '"SD101"' in result.stdout
    assert os.listdir(run_dir) == ["run.db"]


@pytest.mark.skipif(not _as_nobody_possible(), reason="needs root and setpriv to read as nobody")
def test_a_run_directory_that_cannot_be_entered(tmp_path, shared_tmp):
    private = shared_tmp / "private"
    shutil.copytree(_run(tmp_path), private / "run")
    private.chmod(0o700)
    stderr = _one_line_failure(_report(private / "run", *NOBODY))
    assert "cannot read" in stderr and "ermission denied" in stderr


@pytest.mark.skipif(not _as_nobody_possible(), reason="needs root and setpriv to read as nobody")
def test_a_run_directory_that_may_not_be_read_is_one_line_and_exit_1(tmp_path, shared_tmp):
    # (click's own check once answered with its usage banner and exit 2)
    run_dir = shared_tmp / "run"
    shutil.copytree(_run(tmp_path), run_dir)
    run_dir.chmod(0o700)
    stderr = _one_line_failure(_report(run_dir, *NOBODY))
    assert stderr.startswith(f"stalldoc: cannot read {run_dir}") and "Usage" not in stderr


@pytest.mark.skipif(not _as_nobody_possible(), reason="needs root and setpriv to read as nobody")
def test_a_killed_run_copied_read_only_is_read_by_another_user(tmp_path, shared_tmp):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _killed_writer(run_dir)
    copy = shared_tmp / "copy"
    shutil.copytree(run_dir, copy)
    for path in [*copy.iterdir(), copy]:
        path.chmod(0o444 if path.is_file() else 0o555)
    before = _digests(copy)
    result = _report(copy, *NOBODY)
    assert result.returncode == 0 and '"SD101"' in result.stdout, result.stderr
    assert _digests(copy) == before


def _damage_page(run_dir: Path) -> None:
    size = (run_dir / "run.db").stat().st_size
    with open(run_dir / "run.db", "r+b") as fh:
        for offset in range(4096, size, 4096):
            fh.seek(offset)
            fh.write(b"\xff" * 64)


def _sql(run_dir: Path, statement: str) -> None:
    conn = sqlite3.connect(run_dir / "run.db")
    with conn:
        conn.execute(statement)
    conn.close()


def _drop_findings(run_dir: Path) -> None:
    _sql(run_dir, "DROP TABLE findings")


def _bad_json(run_dir: Path) -> None:
    _sql(run_dir, "UPDATE findings SET evidence = '{\"frames\": [trunc'")


def _truncated(run_dir: Path) -> None:
    os.truncate(run_dir / "run.db", 6000)


@pytest.mark.parametrize("damage, says", [(_damage_page, "not a readable stalldoc database"),
                                          (_drop_findings, "no such table: findings"),
                                          (_bad_json, "damaged run database"),
                                          (_truncated, "not a readable stalldoc database")])
def test_a_damaged_run_is_one_line_and_exit_1(tmp_path, damage, says):
    run_dir = _run(tmp_path)
    damage(run_dir)
    before = sorted(os.listdir(run_dir))
    assert says in _one_line_failure(_report(run_dir))
    assert sorted(os.listdir(run_dir)) == before


@pytest.mark.parametrize("write,read", [(1, 2), (2, 1)])
def test_a_header_that_says_wal_in_one_byte_only_is_read_without_writing(tmp_path, write, read):
    # GIVEN a run database whose header's write or read version alone says WAL (a flipped byte;
    # SQLite then opens it in WAL mode and would create -wal and -shm files beside it)
    run_dir = _run(tmp_path)
    with open(run_dir / "run.db", "r+b") as fh:
        fh.seek(18)
        fh.write(bytes([write, read]))
    # WHEN it is reported THEN nothing is written into the run directory
    result = _report(run_dir)
    assert result.returncode in (0, 1), result.stderr
    assert os.listdir(run_dir) == ["run.db"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("pristine")) / "run.db"


_TABLES = ("run", "ranks", "samples", "stalls", "findings", "stacks", "phase_stats",
           "phase_hist", "probe_stats", "node_samples", "gpu_samples", "meta")
_VALUES = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True),
                    st.text(max_size=30), st.binary(max_size=30),
                    st.sampled_from(["{", "[]", "null", "{\"frames\": 3}", "1e999", "4"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 60_000), st.binary(min_size=1, max_size=16)),
                      max_size=4),
       cell=st.tuples(st.sampled_from(_TABLES), st.integers(0, 30), _VALUES),
       cut=st.one_of(st.none(), st.integers(0, 60_000)))
def test_report_of_a_randomly_damaged_run_is_a_report_or_one_line(tmp_path, pristine, flips,
                                                                  cell, cut):
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))
    shutil.copyfile(pristine, run_dir / "run.db")
    table, column, value = cell
    conn = sqlite3.connect(run_dir / "run.db")
    names = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    with contextlib.suppress(sqlite3.IntegrityError), conn:   # NOT NULL: another damage then
        conn.execute(f"UPDATE {table} SET {names[column % len(names)]} = ?", (value,))
    conn.close()
    data = bytearray((run_dir / "run.db").read_bytes())
    for offset, chunk in flips:
        data[offset:offset + len(chunk)] = chunk
    (run_dir / "run.db").write_bytes(bytes(data[:cut] if cut is not None else data))
    for fmt in ("json", "text"):
        result = CliRunner().invoke(main, ["report", str(run_dir), "--format", fmt])
        assert result.exit_code in (0, 1), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            repr(result.exception)
    assert os.listdir(run_dir) == ["run.db"]


def test_a_start_time_past_the_platforms_clock_is_one_line(tmp_path, pristine):
    # the damage the test above once drew (hypothesis seed 15): a start time of 6.8e16 s, which
    # the text report's clock formatting cannot say (OverflowError), where JSON can
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copyfile(pristine, run_dir / "run.db")
    with contextlib.closing(sqlite3.connect(run_dir / "run.db")) as conn, conn:
        conn.execute("UPDATE run SET started_at = ?", (6.77679762335328e+16,))
    result = CliRunner().invoke(main, ["report", str(run_dir), "--format", "text"])
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1 and "damaged run database (OverflowError" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert os.listdir(run_dir) == ["run.db"]


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_schema_3_run_reads_as_the_version_that_wrote_it(tmp_path):
    # run_v3.sql: the database of a real `stalldoc demo` written by schema 3 (stalldoc 5e5b482);
    # report_v3.json: that version's own report of it. Every field it had is unchanged, but
    # for one thing said since: a stack is shown as the user wrote it, without the agent's
    # pass-through wrapper (its collectives hook, between torch's all_reduce and the user's main)
    conn = sqlite3.connect(tmp_path / "run.db")
    conn.executescript((FIXTURES / "run_v3.sql").read_text())
    conn.close()
    old = json.loads((FIXTURES / "report_v3.json").read_text())
    hooked = [t for s in old["stacks"] for t in s["threads"]
              if any(f["function"] == "wrap.<locals>.wrapper" for f in t["frames"])]
    assert len(hooked) == 2   # the main threads of the two ranks in the hang's all_reduce
    for thread in hooked:
        thread["frames"] = [f for f in thread["frames"] if f["function"] != "wrap.<locals>.wrapper"]
    new = json.loads(json.dumps(build_report(tmp_path), default=str))
    assert new["run"]["schema_version"] == 3
    assert {k: new["run"][k] for k in old["run"]} == old["run"]
    assert [{k: p[k] for k in old["probes"][0]} for p in new["probes"]] == old["probes"]
    for key in old:   # every field it had, unchanged; fields added since may stand beside them
        if key not in ("run", "probes"):
            assert same_fields(new[key], old[key]), key


def same_fields(new: Any, old: Any) -> bool:
    """``new`` has every field of ``old`` with the same value (dicts may hold more)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and same_fields(new[k], v)
                                             for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(
            same_fields(n, o) for n, o in zip(new, old))
    return new == old
