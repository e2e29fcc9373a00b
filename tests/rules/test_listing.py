"""The rule table of ``stalldoc rules``: a header, aligned columns, summaries never cut."""
from __future__ import annotations

from stalldoc.rules import RULES
from stalldoc.rules.listing import WHEN, render_table, rule_rows, summary_of


def test_every_trigger_has_a_word_and_a_meaning():
    assert {rule.trigger for rule in RULES} <= set(WHEN)


def test_columns_line_up_under_the_header_and_summaries_run_on_in_a_pipe():
    rows = rule_rows(RULES)
    lines = render_table(rows, None).splitlines()
    header, body = lines[0], lines[1:len(rows) + 1]
    starts = [header.index(word) for word in ("SEVERITY", "RUNS", "NAME", "SUMMARY")]
    for line, row in zip(body, rows):
        assert [line.index(cell, start) for cell, start in
                zip((row.severity, WHEN[row.trigger][0], row.name, row.summary), starts)] == starts
        assert line.endswith(row.summary)
    assert "RUNS:" in lines[len(rows) + 1:]


def test_a_summary_is_the_whole_first_paragraph():
    by_code = {rule.code: rule for rule in RULES}
    summary = summary_of(by_code["SD202"])       # its first paragraph spans two lines
    assert summary.startswith("GPU memory at the edge") and summary.endswith(".")
    assert all(summary_of(rule).endswith((".", ")")) for rule in RULES)


def test_on_a_terminal_long_summaries_wrap_under_their_column():
    rows = rule_rows(RULES)
    lines = render_table(rows, 100).splitlines()
    column = lines[0].index("SUMMARY")
    assert all(len(line) <= 100 for line in lines)
    continued = [line for line in lines[1:] if line.startswith(" " * column) and line.strip()]
    assert continued and all(line[column] != " " for line in continued)
    words = " ".join(line[column:] for line in lines[1:] if line[:column].strip() or
                     line.startswith(" " * column))
    assert all(row.summary.split()[-1] in words for row in rows)
