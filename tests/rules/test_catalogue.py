"""Every rule documents itself the same way and has a code of its own."""
from __future__ import annotations

import re

from stalldoc.rules import RULES, by_code
from stalldoc.rules.base import DOC_SECTIONS


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
