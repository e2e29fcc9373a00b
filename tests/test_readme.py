"""README's promises that code can check: its two first commands (and CI running the second
exactly), its length, its demo block (the real demo's, from docs/pictures.py), its links, and the
docs' sentence on the run store's schema version."""
from __future__ import annotations

import re
from pathlib import Path

from stalldoc.store.schema import READABLE_VERSIONS, SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def command_after(comment: str) -> str:
    """The line that follows README's ``# <comment>...`` line in its first code block."""
    lines = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(f"# {comment}"))
    return lines[index + 1]


def test_the_first_command_installs_only_what_the_demo_needs():
    first = command_after("1.")
    assert "-e '.[demo]' && stalldoc demo" in first and "test" not in first
    demo = re.search(r"^demo = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert demo and set(re.findall(r'"([^"]+)"', demo.group(1))) == {"torch", "numpy"}


def test_ci_runs_exactly_the_readmes_test_command():
    second = command_after("2.")
    assert second == ("pip install -c constraints.txt -e '.[demo,test]' && "
                      "python -m pytest -q -n auto")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == second


def test_the_schema_version_sentence_is_true():
    docs = "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    match = re.search(r"schema version (\d+); reports read (\d+) to (\d+)", docs)
    assert match, "the docs no longer state the schema version"
    assert int(match.group(1)) == SCHEMA_VERSION
    assert (match.group(2), match.group(3)) == (READABLE_VERSIONS[0], READABLE_VERSIONS[-1])
    assert [int(v) for v in READABLE_VERSIONS] == list(range(int(READABLE_VERSIONS[0]),
                                                             SCHEMA_VERSION + 1))


def test_readme_is_read_in_two_minutes():
    assert len(README.splitlines()) <= 150


def test_the_demo_block_is_the_real_demos_output():
    block = README.split("<!-- demo:start -->\n```text\n", 1)[1].split("```\n<!-- demo:end -->")[0]
    assert block == (DOCS / "demo.txt").read_text()
    assert "[SD101 error] rank 1 not in all_reduce" in block     # what the demo is about


def test_every_local_link_and_picture_of_the_readme_exists():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert "docs/report.png" in local and len(local) >= 10
    assert [t for t in local if not (ROOT / t).exists()] == []
