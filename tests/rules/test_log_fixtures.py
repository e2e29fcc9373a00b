"""Every log-signature rule against the real lines in its fixture file.

``tests/rules/fixtures/log/SDnnn.txt`` holds lines quoted verbatim from public issue threads::

    # source: https://github.com/OWNER/REPO/issues/N
    #> seq=5 op=_ALLGATHER_BASE ranks=1
    <a line the job printed>
    # good
    <a look-alike line that is not the problem>

Lines under a ``# source:`` must be found by the rule (also behind every prefix a launcher adds);
a ``#>`` line lists figures the next line's finding must carry (``ranks=`` the ranks it blames,
comma separated, empty for none). Lines under ``# good`` must not be found. Every source must be
named in the rule's References as ``OWNER/REPO#N``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import RULES, by_code
from stalldoc.rules.log_signature import LogSignature

FIXTURES = Path(__file__).parent / "fixtures" / "log"
SOURCE = re.compile(r"https://github\.com/([\w.-]+/[\w.-]+)/(?:issues|pull|discussions)/(\d+)")
# what launchers put in front of a rank's line: torchrun --tee / --log-line-prefix-template,
# mpirun --tag-output, srun --label, pdsh (DeepSpeed multi-node), accelerate / swift (none)
LAUNCHER_PREFIXES = ("", "[default0]:", "[default3]:", "[1,0]<stderr>:", "0: ", "12: ",
                     "worker-1: ", "10.0.0.5: ", "(RayWorkerWrapper pid=3456) ")


@dataclass
class Fixture:
    code: str
    bad: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # source, line, figures
    good: list[str] = field(default_factory=list)


def load(path: Path) -> Fixture:
    fixture, source, figures, good = Fixture(path.stem), "", {}, False
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("# source:"):
            source, good = raw.split(":", 1)[1].strip(), False
        elif raw.strip() == "# good":
            good = True
        elif raw.startswith("#>"):
            figures = dict(item.split("=", 1) for item in raw[2:].split())
        elif raw.startswith("#") or not raw.strip():
            continue
        elif good:
            fixture.good.append(raw)
        else:
            assert source, f"{path.name}: a line before any '# source:'"
            fixture.bad.append((source, raw, figures))
            figures = {}
    return fixture


FILES = sorted(FIXTURES.glob("SD*.txt"))
CASES = [(f.code, src, line, figs) for f in map(load, FILES) for src, line, figs in f.bad]
GOOD = [(f.code, line) for f in map(load, FILES) for line in f.good]


def window(*texts: str) -> Window:
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in texts))


@pytest.mark.parametrize("code,source,line,figures", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_real_line_is_found_behind_any_launcher_prefix(code, source, line, figures):
    rule = by_code(code)()
    for prefix in LAUNCHER_PREFIXES:
        found = list(rule.check(window("step 3 ok", prefix + line)))
        assert len(found) == 1, (prefix, line)
        evidence = found[0].evidence
        expected = dict(figures)
        ranks = expected.pop("ranks", None)
        if ranks is not None:
            assert list(found[0].ranks) == [int(r) for r in ranks.split(",") if r], prefix
        assert {k: str(evidence.get(k)) for k in expected} == expected, prefix
        assert evidence["lines"][0] == (prefix + line).strip()[:400]


@pytest.mark.parametrize("code,line", GOOD, ids=[f"{c[0]}-good-{i}" for i, c in enumerate(GOOD)])
def test_look_alike_line_is_not_found(code, line):
    assert list(by_code(code)().check(window(line))) == []


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_every_source_is_in_the_rules_references(path):
    fixture = load(path)
    doc = by_code(fixture.code).doc()
    references = doc[doc.index("References"):] if "References" in doc else ""
    for source, _, _ in fixture.bad:
        match = SOURCE.fullmatch(source)
        assert match, f"{path.name}: source must be a GitHub issue, pull or discussion: {source}"
        assert f"{match[1]}#{match[2]}" in references, (path.name, source)


def test_every_log_rule_has_real_lines():
    log_rules = {r.code for r in RULES if issubclass(r, LogSignature)}
    with_lines = {code for code, *_ in CASES}
    assert log_rules <= with_lines, sorted(log_rules - with_lines)
    assert {f.stem for f in FILES} <= log_rules


def test_catalogue_breadth():
    """At least 40 distinct real lines across at least 12 rules."""
    assert len({line for _, _, line, _ in CASES}) >= 40
    assert len({code for code, *_ in CASES}) >= 12
