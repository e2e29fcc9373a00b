"""The collectives the agents' rings show are stored once each (schema 5): a pending one is
stored and completed later, at most the policy's newest per rank and tick, dropped by retention
with the phases (a pending one stays), and read back as ``CollectiveSpan``s."""
from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from support import synthetic_tick
from stalldoc.model.collectives import CollectiveRecord, GroupState
from stalldoc.model.work import StallEpisode
from stalldoc.report.read import read_report
from stalldoc.report.records import CollectiveSpan
from stalldoc.store.db import RunStore
from stalldoc.store.retention import RetentionPolicy
from stalldoc.store.schema import SCHEMA_VERSION

T0 = 1_700_000_000.0
RING = 64


def call(seq: int, t: float, done: bool = True, group: str = "world") -> CollectiveRecord:
    return CollectiveRecord(group, seq, "all_reduce", 1024, "float32", t,
                            t + 0.01 if done else None, False)


def tick_with(t: float, ring: tuple[CollectiveRecord, ...], ranks: int = 2):
    tick = synthetic_tick(t, ranks, 0, "step")
    groups = (GroupState("world", len(ring), len(ring), ring[-RING:]),)
    return dataclasses.replace(tick, agents={r: dataclasses.replace(a, groups=groups)
                                             for r, a in tick.agents.items()})


def rows(run_dir: Path) -> list[tuple]:
    conn = sqlite3.connect(run_dir / "run.db")
    return conn.execute("SELECT rank, grp, seq, completed_at FROM collectives "
                        "ORDER BY rank, seq").fetchall()


def test_each_call_is_stored_once_and_a_pending_one_completes(tmp_path):
    store = RunStore(tmp_path)
    store.start_run("r", ["train.py"], "node", T0, 45, True)
    ring = (call(1, T0), call(2, T0 + 0.5, done=False))
    store.add_tick(tick_with(T0 + 1, ring))
    store.add_tick(tick_with(T0 + 2, ring))                        # the same ring again
    ring = (call(1, T0), call(2, T0 + 0.5), call(3, T0 + 2.5))     # #2 completed
    store.add_tick(tick_with(T0 + 3, ring))
    store.end_run(T0 + 4, 0)
    store.close()
    assert [r[:3] for r in rows(tmp_path)] == [(rank, "world", seq) for rank in (0, 1)
                                               for seq in (1, 2, 3)]
    assert all(r[3] is not None for r in rows(tmp_path))
    run = read_report([tmp_path]).runs[0]
    assert run.info.schema_version == SCHEMA_VERSION >= 5   # collectives came with 5
    assert run.collectives[1] == CollectiveSpan(0, "world", 2, "all_reduce", 1024, "float32",
                                                T0 + 0.5, T0 + 0.51)


def test_at_most_the_newest_per_tick_and_pending_ones_always(tmp_path):
    store = RunStore(tmp_path, RetentionPolicy(collectives_per_rank_tick=10))
    ring = tuple(call(s, T0 + s * 1e-3, done=s != 3) for s in range(1, 65))   # a full ring
    store.add_tick(tick_with(T0 + 1, ring, ranks=1))
    store.end_run(T0 + 2, 0)
    store.close()
    assert [r[2] for r in rows(tmp_path)] == [3, *range(55, 65)]
    assert read_report([tmp_path]).runs[0].info  # readable
    meta = dict(sqlite3.connect(tmp_path / "run.db").execute("SELECT key, value FROM meta"))
    assert meta["dropped_collectives"] == str(64 - 11)


def test_collectives_a_ring_overwrote_before_they_were_read_count_as_dropped(tmp_path):
    """``GroupState.wrapped`` grows from read to read: each collective is counted once."""
    store = RunStore(tmp_path, RetentionPolicy(collectives_per_rank_tick=100))
    for t, wrapped in ((1, 0), (2, 36), (3, 36), (4, 500)):
        ring = tuple(call(s, T0 + t + s * 1e-6) for s in range(wrapped + 1, wrapped + 65))
        tick = tick_with(T0 + t, ring, ranks=1)
        [(rank, agent)] = tick.agents.items()
        groups = (dataclasses.replace(agent.groups[0], wrapped=wrapped),)
        store.add_tick(dataclasses.replace(tick, agents={rank: dataclasses.replace(
            agent, groups=groups)}))
    store.end_run(T0 + 5, 0)
    store.close()
    meta = dict(sqlite3.connect(tmp_path / "run.db").execute("SELECT key, value FROM meta"))
    assert meta["dropped_collectives"] == "500"


def test_retention_drops_old_calls_but_not_a_pending_one_nor_a_stalls_lead_up(tmp_path):
    store = RunStore(tmp_path, RetentionPolicy(bucket_seconds=60, collectives_seconds=120,
                                               collectives_before=30))
    store.save_stall(StallEpisode(1, T0 + 500, T0 + 520, 20, (0,), ended_at=T0 + 530))
    ring: tuple[CollectiveRecord, ...] = (call(1, T0, done=False, group="pp"),)
    for i in range(1, 1200):
        if i % 10 == 0:
            ring = ring[:1] + (ring[1:] + (call(i, T0 + i),))[-RING:]
        store.add_tick(tick_with(T0 + i, ring, ranks=1))
        store.compact(T0 + i, 0)
    store.close()
    kept = rows(tmp_path)
    assert ("pp", 1, None) in [r[1:] for r in kept]                 # still pending: kept
    seqs = [seq for _, grp, seq, _ in kept if grp == "world"]
    assert [s for s in seqs if s < 1000] == list(range(470, 590, 10))   # the stall's surroundings
    assert min(s for s in seqs if s > 1000) >= 1200 - 120 - 60 and max(seqs) == 1190
