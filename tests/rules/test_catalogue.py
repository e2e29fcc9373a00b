"""Every rule documents itself the same way and has a code of its own."""
from __future__ import annotations

import re
import textwrap

import pytest

from stalldoc.model.findings import Severity
from stalldoc.rules import RULES, by_code
from stalldoc.rules.base import DOC_SECTIONS, Rule, doc_section


def test_codes_are_unique_and_well_formed():
    codes = [rule.code for rule in RULES]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"SD[1-5]\d\d", code) for code in codes)
    assert len({rule.name for rule in RULES}) == len(RULES)


def test_every_rule_has_the_doc_sections_in_order():
    for rule in RULES:
        doc = rule.doc()
        found = [re.search(rf"^{re.escape(section)}:?$", doc, re.M) for section in DOC_SECTIONS]
        assert all(found), (rule.code, found)
        positions = [m.start() for m in found]
        assert positions == sorted(positions), rule.code
        assert rule.fix.strip()


def test_lookup_by_code():
    assert by_code("sd101").name == "rank-outside-collective"
    assert by_code("SD999") is None


def test_every_rule_prints_the_first_paragraph_of_its_fix_section():
    for rule in RULES:
        first = doc_section(rule.doc(), "Fix").split("\n\n")[0]
        assert rule.fix == " ".join(first.replace("``", "`").split()), rule.code
        assert rule.fix.endswith("."), rule.code
        assert len(rule.fix) <= 400, (rule.code, len(rule.fix))     # one short paragraph
        finding = rule().finding((0,), "summary", {})
        assert finding.fix == rule.fix


def test_a_finding_keeps_the_fix_its_occurrence_passes():
    rule = by_code("SD101")()
    assert rule.finding((1,), "summary", {}, fix="Restart rank 1.").fix == "Restart rank 1."


def test_the_fix_is_derived_from_the_docstring_and_the_rest_is_for_explain():
    class TwoParagraphs(Rule):
        """A made-up rule.

        What it does
            Nothing.

        Fix
            Do the first ``thing``,
            on two lines.

            Then read this in explain.

        References
            none.
        """

        code, name, severity = "SD999", "made-up", Severity.INFO

        def check(self, window):
            yield from ()

    assert TwoParagraphs.fix == "Do the first `thing`, on two lines."


def test_a_rule_that_sets_its_own_fix_or_has_no_fix_section_fails_at_import():
    with pytest.raises(TypeError, match="Fix section"):
        exec(textwrap.dedent('''
            class Both(Rule):
                """A rule with both.

                Fix
                    The section.
                """
                code = "SD998"
                fix = "The attribute."
        '''), {"Rule": Rule})
    with pytest.raises(TypeError, match="needs a Fix section"):
        exec(textwrap.dedent('''
            class Neither(Rule):
                """A rule without a fix."""
                code = "SD997"
        '''), {"Rule": Rule})


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_explain_points_only_at_what_a_user_has(rule) -> None:
    # `stalldoc explain` prints the docstring: no file of this project's own notes or tests
    text = rule.__doc__ or ""
    notes = r"anchors\.md|swift\.md|design\.md|shared/notes|(?<![.\w])\.\./|(?<![\w/])tests/"
    assert not re.search(notes, text), rule.code
