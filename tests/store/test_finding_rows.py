"""The store writes the ledger's entries as rows: the entry's record, updated and resolved in
place, with the trigger of every kind."""
from __future__ import annotations

import sqlite3

from stalldoc.findings.ledger import Ledger
from stalldoc.findings.record import entry_record
from stalldoc.model.findings import Finding, Severity
from stalldoc.report.build import build_report
from stalldoc.store.db import RunStore


def finding(code: str, ranks: tuple[int, ...], summary: str = "s") -> Finding:
    return Finding(code, "n", Severity.ERROR, ranks, summary, {"frames": ["f (a.py:1)"]}, "fix")


def test_rows_are_the_entries_records_through_their_life(tmp_path):
    # GIVEN findings of every trigger, some updated and resolved, each change stored
    store, ledger = RunStore(tmp_path), Ledger()
    store.start_run("run", ["python", "train.py"], "node", 1.0, 45, True)
    changes = [ledger.launch(1.0, [finding("SD404", ())]),
               ledger.stall(2.0, 1, [finding("SD101", (1,))]),
               ledger.tick(2.5, [finding("SD301", (0,))]),
               ledger.exits(3.0, [finding("SD103", (2,), "rank 2 died")]),
               ledger.tick(3.5, [finding("SD301", (0,), "worse")]),
               ledger.exits(4.0, [finding("SD103", (2,), "rank 2 died; rank 0 followed")]),
               ledger.stall_ended(5.0, 1),
               ledger.tick(6.0, [])]
    latest = {}
    for change in changes:
        store.put_findings(change.entries)
        latest.update({e.id: e for e in change.entries})
    store.end_run(7.0, 1)
    store.close()
    # THEN there is one row per entry, equal to its last record (the report reads the state
    # back from resolved_at, as the ledger gives it)
    rows = build_report(tmp_path)["findings"]
    expected = [entry_record(latest[i]) for i in sorted(latest)]
    assert rows == expected
    assert [(r["code"], r["trigger"]) for r in rows] == [
        ("SD404", "launch"), ("SD101", "stall"), ("SD301", "tick"), ("SD103", "exit")]
    assert [r["resolved_at"] for r in rows] == [None, 5.0, 6.0, None]
    assert rows[2]["summary"] == "worse" and rows[2]["occurrences"] == 2
    assert rows[3]["summary"] == "rank 2 died; rank 0 followed" and rows[3]["updated_at"] == 4.0
    # AND open in the store (resolved_at IS NULL) is the ledger's open
    conn = sqlite3.connect(tmp_path / "run.db")
    open_rows = conn.execute("SELECT code, severity, COUNT(*) FROM findings WHERE resolved_at "
                             "IS NULL GROUP BY code, severity").fetchall()
    assert {(c, s): n for c, s, n in open_rows} == ledger.open_counts()
