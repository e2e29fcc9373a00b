"""The store stays bounded over days without losing what the report says: downsampling keeps the
peaks, the lowest available memory, the sample-weighted means, full resolution around stalls
and findings, exact phase counts; logs keep their head and latest tail; stacks of the first and
latest stalls stay."""
from __future__ import annotations

import sqlite3

import pytest

from support import synthetic_tick
from stalldoc.model.agent import PhaseRecord
from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.samples import LogLine
from stalldoc.model.stacks import RankStacks
from stalldoc.model.work import StallEpisode
from stalldoc.report import telemetry
from stalldoc.report.build import build_report
from stalldoc.store.db import RunStore
from stalldoc.store.retention import RetentionPolicy, gaps

T0 = 1_700_000_000.0
POLICY = RetentionPolicy(bucket_seconds=60, full_resolution_seconds=300, around_before=120,
                         around_after=60, finding_before=90, finding_after=30)


def _fill(store: RunStore, seconds: int, compact: bool, ranks: int = 3, gpus: int = 2) -> None:
    for i in range(seconds):
        t = T0 + i
        store.add_tick(synthetic_tick(t, ranks, gpus, "rollout" if (i // 90) % 2 else "train"))
        if compact:
            store.compact(t, 0)


def _rows(store: RunStore, table: str) -> int:
    return store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _report(tmp_path, name: str, seconds: int, compact: bool, extra=None) -> tuple[dict, RunStore]:
    run_dir = tmp_path / name
    run_dir.mkdir()
    store = RunStore(run_dir, POLICY)
    store.start_run(name, ["train.py"], "node", T0, 45, True)
    if extra:
        extra(store)
    _fill(store, seconds, compact)
    counts = {t: _rows(store, t) for t in ("samples", "gpu_samples", "node_samples")}
    store.end_run(T0 + seconds, 0)
    store.close()
    return build_report(run_dir), counts


def test_gaps_leave_out_the_kept_spans():
    assert gaps(0, 100, []) == [(0, 100)]
    assert gaps(0, 100, [(10, 20), (15, 30), (90, 200)]) == [(0, 10), (30, 90)]
    assert gaps(0, 100, [(-5, 200)]) == []
    assert gaps(50, 100, [(0, 60), (70, 80)]) == [(60, 70), (80, 100)]


def test_downsampling_keeps_what_the_report_says(tmp_path):
    full, raw_counts = _report(tmp_path, "full", 1800, compact=False)
    small, counts = _report(tmp_path, "small", 1800, compact=True)
    assert counts["samples"] < raw_counts["samples"] / 4
    assert counts["gpu_samples"] < raw_counts["gpu_samples"] / 4
    assert counts["node_samples"] < raw_counts["node_samples"] / 4
    every = sqlite3.connect(tmp_path / "full" / "run.db")   # all samples of the same run
    every.row_factory = sqlite3.Row
    assert small["watermarks"] == telemetry.watermarks_from_samples(every)   # per rank, phase
    expected = telemetry.gpu_phases_from_samples(every)
    assert len(small["gpu_phases"]) == len(expected) == 2
    for got, want in zip(small["gpu_phases"], expected):   # sums in another order: approx
        assert got == {k: pytest.approx(v, rel=1e-9) if k != "phase" else v
                       for k, v in want.items()}
    assert {p["phase"] for p in small["gpu_phases"]} == {"step/rollout", "step/train"}
    assert small["host"] == full["host"]                    # lowest available memory, peaks
    for a, b in zip(small["gpus"], full["gpus"]):
        assert a["util_gpu_mean"] == b["util_gpu_mean"]     # weighted by samples
        assert a["util_compute_mean"] == b["util_compute_mean"] is not None
        assert a["peak_memory_used"] == b["peak_memory_used"]
    assert [p["runs"] for p in small["probes"]] == [p["runs"] for p in full["probes"]] == [1800, 1800]
    assert small["probes"][1]["failures"] == full["probes"][1]["failures"] > 0
    series = small["timeseries"]["ranks"]
    assert {row["phase"] for row in series} == {"step/rollout", "step/train"}
    assert max(row["t"] for row in series) == T0 + 1799     # the latest stays at full resolution


def test_full_resolution_around_a_stall_and_a_finding(tmp_path):
    stall_at, finding_at = T0 + 600, T0 + 1200

    def events(store: RunStore) -> None:
        store.save_stall(StallEpisode(1, stall_at, stall_at + 45, 45, (0, 1, 2)))
        store.put_findings(Ledger().tick(finding_at, [Finding(
            "SD108", "slow-rank", Severity.WARNING, (0,), "slow", {}, "wait")]).entries)

    _report(tmp_path, "events", 1800, compact=True, extra=events)
    conn = sqlite3.connect(tmp_path / "events" / "run.db")
    times = [t for (t,) in conn.execute("SELECT DISTINCT t FROM samples ORDER BY t")]
    for lo, hi in ((stall_at - 120, stall_at + 45 + 60), (finding_at - 90, finding_at + 30)):
        kept = [t for t in times if lo <= t < hi]
        assert len(kept) == hi - lo                          # every second of it
    quiet = [t for t in times if T0 + 60 <= t < stall_at - 120]
    assert len(quiet) < (stall_at - 120 - T0 - 60) / 20      # the rest downsampled


def test_phase_counts_are_exact_and_repeated_rings_are_counted_once(tmp_path):
    store = RunStore(tmp_path, POLICY)
    ring: tuple[PhaseRecord, ...] = ()
    for i in range(400):
        t = T0 + i
        if i % 4 == 3:   # a phase of 3 s ends every 4 s; the ring holds the newest 16
            ring = (ring + (PhaseRecord("generate", t - 3.0, t),))[-16:]
        store.add_tick(synthetic_tick(t, 2, 0, "generate", phases=ring))
        store.compact(t, 0)
    store.close()
    phases = build_report(tmp_path)["phases"]
    assert phases["generate"]["count"] == 2 * 100
    assert phases["generate"]["median"] == phases["generate"]["max"] == 3.0
    assert sqlite3.connect(tmp_path / "run.db").execute(
        "SELECT COUNT(*) FROM phases").fetchone()[0] < 2 * 100    # raw rows were dropped


def test_logs_keep_their_head_and_their_latest_lines(tmp_path):
    policy = RetentionPolicy(log_head_bytes=10_000, log_tail_bytes=20_000)
    store = RunStore(tmp_path, policy)
    for batch in range(200):
        store.add_logs([LogLine(T0 + batch, "stdout", f"line {batch}-{i} " + "x" * 76)
                        for i in range(10)])
    store.end_run(T0 + 200, 0)
    store.close()
    conn = sqlite3.connect(tmp_path / "run.db")
    lines = [line for (line,) in conn.execute("SELECT line FROM logs ORDER BY rowid")]
    assert lines[0].startswith("line 0-0 ") and lines[-1].startswith("line 199-9 ")
    assert sum(len(x) for x in lines) < 10_000 + 20_000 + 2_000
    run = build_report(tmp_path)["run"]
    assert run["pruned_log_lines"] == 2000 - len(lines) > 0


def test_stacks_of_the_first_and_latest_stalls_stay(tmp_path):
    store = RunStore(tmp_path, RetentionPolicy(stacks_first_stalls=2, stacks_last_stalls=3))
    for stall in range(1, 11):
        store.save_stall(StallEpisode(stall, T0 + stall, T0 + stall, 45, (0,)))
        store.add_stacks(stall, [RankStacks(0, 100, T0 + stall, "py-spy", ())])
    store.end_run(T0 + 20, 0)
    store.close()
    doc = build_report(tmp_path)
    assert sorted({s["stall_id"] for s in doc["stacks"]}) == [1, 2, 8, 9, 10]
    assert doc["run"]["pruned_stall_stacks"] == 5
    assert len(doc["stalls"]) == 10


def test_time_series_are_thinned_evenly_in_time_to_1000_points(tmp_path):
    store = RunStore(tmp_path, RetentionPolicy(full_resolution_seconds=1e9))
    for i in range(3000):   # full resolution for the first 1000 s, then a row a minute (as kept)
        store.add_tick(synthetic_tick(T0 + (i if i < 1000 else 1000 + (i - 1000) * 60), 1, 1,
                                      "train"))
    store.close()
    series = build_report(tmp_path)["timeseries"]
    for rows in (series["ranks"], series["gpus"], series["node"]):
        times = [row["t"] for row in rows]
        assert len(times) <= 1000 and times == sorted(times)
        assert times[-1] == T0 + 1000 + 1999 * 60                    # the latest is there
        span = (times[-1] - T0) / 999
        early = [t for t in times if t < T0 + 1000]
        assert len(early) <= 1000 / span + 1      # the dense first part does not crowd it out
