"""One serialized shape of a finding: what check prints as JSON, what the store writes, what the
watcher and the report print."""
from __future__ import annotations

from pathlib import Path

from stalldoc.check.preflight import finding_dict
from stalldoc.findings.ledger import Ledger
from stalldoc.findings.record import entry_record, finding_fields, finding_record
from stalldoc.model.findings import Finding, Severity
from stalldoc.report.build import build_report
from stalldoc.report.formats.text import REPORTER as TEXT
from stalldoc.report.read import read_report
from stalldoc.report.text import FIX_WIDTH, record_lines, render_findings
from stalldoc.store.db import RunStore

FRAMES = [f"f{i} (train.py:{i})" for i in range(10)]
DEAD = Finding("SD103", "dead-rank", Severity.CRITICAL, (2,), "rank 2 died (SIGKILL)",
               {"frames": tuple(FRAMES), "signal": 9, "path": Path("/tmp/x")}, "look at dmesg")


def test_the_finding_as_plain_json_values():
    fields = finding_fields(DEAD)
    assert list(fields) == ["code", "name", "severity", "ranks", "summary", "evidence", "fix"]
    assert fields["severity"] == "critical" and fields["ranks"] == [2]
    assert fields["evidence"] == {"frames": FRAMES, "signal": 9, "path": "/tmp/x"}


def test_check_lists_a_finding_as_its_record_with_the_launch_trigger():
    assert finding_dict(DEAD) == finding_record(DEAD, "launch") == {
        **finding_fields(DEAD), "trigger": "launch"}


def test_an_entry_carries_its_life():
    ledger = Ledger()
    [entry] = ledger.exits(5.0, [DEAD]).opened
    record = entry_record(entry)
    assert record == {**finding_fields(DEAD), "trigger": "exit", "id": 1, "t": 5.0,
                      "stall_id": None, "updated_at": 5.0, "resolved_at": None,
                      "occurrences": 1, "state": "open"}
    [stall] = ledger.stall(6.0, 3, [DEAD]).opened
    [resolved] = ledger.stall_ended(9.0, 3).resolved
    assert entry_record(resolved) == {**entry_record(stall), "resolved_at": 9.0,
                                      "state": "resolved"}


def test_the_watcher_and_the_report_print_a_finding_alike(tmp_path):
    # GIVEN a finding the watcher printed and stored
    printed = render_findings([DEAD]).splitlines()
    assert printed == record_lines(finding_fields(DEAD))
    assert printed[0] == "  [SD103 critical] rank 2 died (SIGKILL)"
    assert printed[1:-1] == [f"      {frame}" for frame in FRAMES[:8]]
    assert printed[-1] == "      fix: look at dmesg"
    store = RunStore(tmp_path)
    store.start_run("run", ["python", "train.py"], "node", 1.0, 45, True)
    store.put_findings(Ledger().exits(2.0, [DEAD]).entries)
    store.end_run(3.0, 1)
    store.close()
    # THEN the report shows the same lines, from the stored row
    doc = build_report(tmp_path)
    [row] = doc["findings"]
    assert record_lines(row) == printed
    text = TEXT.render(read_report([tmp_path]))
    assert "\n".join(printed) in text


def test_a_long_fix_is_wrapped_for_a_terminal_and_its_words_kept_whole():
    # GIVEN a real rule's fix (SD101's, over 300 characters) and one with a long command
    from stalldoc.rules import by_code
    fix = by_code("SD101").fix
    command = "pip install -c constraints.txt --extra-index-url https://example.org/simple/ x"
    for text in (fix, f"run {command} {'again ' * 20}"):
        lines = record_lines({"code": "SD101", "severity": "error", "summary": "s",
                              "evidence": {}, "fix": text})[1:]
        # THEN each line fits the width, the first says fix:, the rest line up under it,
        # and the words read back as they were
        assert len(lines) > 1 and all(len(line) <= FIX_WIDTH for line in lines), lines
        assert lines[0].startswith("      fix: ")
        assert all(line.startswith(" " * 11) and line[11] != " " for line in lines[1:])
        assert " ".join(line.strip() for line in lines)[len("fix: "):] == " ".join(text.split())
