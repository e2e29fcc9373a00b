"""The docs site: generated from the code (``docs/generate.py``) and built with MkDocs with
warnings as errors, in a copy of ``docs/``; every rule has a page that says what its code says,
and the command-line page has every command and option."""
from __future__ import annotations

import html
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from stalldoc.cli import main as cli_main
from stalldoc.rules import RULES
from stalldoc.rules.base import DOC_SECTIONS, doc_section

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("mkdocs") is None and
                                importlib.util.find_spec("mkdocs") is None,
                                reason="needs mkdocs (the test extra installs it)")


def load_generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from a copy of docs/ (the checkout is left as it is)."""
    work = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("reference"))
    shutil.copy(ROOT / "mkdocs.yml", work / "mkdocs.yml")
    load_generator().generate(work / "docs" / "reference")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                          str(work / "mkdocs.yml"), "-d", str(work / "site")],
                         capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return work / "site"


def text_of(page: Path) -> str:
    """A built page's words: tags removed, entities decoded, spaces folded."""
    raw = re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))
    return " ".join(html.unescape(raw).split())


def words(docstring_text: str) -> str:
    return " ".join(re.sub(r"``(.+?)``", r"\1", docstring_text).split())


def says(text: str, part: str) -> bool:
    """``part`` is in ``text``, whatever the spacing and backquotes (markup around code)."""
    def squeeze(value: str) -> str:
        return re.sub(r"[\s`*]+", "", value)
    return squeeze(part) in squeeze(text)


def test_every_rule_has_a_page_that_says_what_its_code_says(site: Path):
    for rule in RULES:
        page = site / "reference" / "rules" / rule.code.lower() / "index.html"
        assert page.exists(), f"{rule.code} has no page"
        text = text_of(page)
        assert f"{rule.code} {rule.name}" in text and rule.severity.value in text
        for heading in DOC_SECTIONS:
            body = words(doc_section(rule.doc(), heading))
            assert body and says(text, body), (rule.code, heading)
        assert says(text, rule.fix), rule.code


def test_the_catalogue_lists_every_rule_once(site: Path):
    text = text_of(site / "reference" / "rules" / "index.html")
    for rule in RULES:
        assert text.count(f"{rule.code} {rule.name}") == 1, rule.code


def test_a_log_rule_page_cites_the_threads_its_fixture_quotes(site: Path):
    fixture = (ROOT / "tests" / "rules" / "fixtures" / "log" / "SD501.txt").read_text()
    sources = re.findall(r"# source: (\S+)", fixture)
    text = text_of(site / "reference" / "rules" / "sd501" / "index.html")
    assert sources and all(url in text for url in sources)
    assert "test_" in text          # the cases the tests hold it to


def test_the_command_line_page_has_every_command_and_option(site: Path):
    text = text_of(site / "reference" / "cli" / "index.html")
    with click.Context(cli_main) as ctx:
        for name in cli_main.list_commands(ctx):
            command = cli_main.get_command(ctx, name)
            assert f"stalldoc {name}" in text
            for param in command.params:
                for flag in getattr(param, "opts", []):
                    if flag.startswith("-"):
                        assert flag in text, (name, flag)


def test_every_page_of_docs_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages and {p for p in pages if p not in nav} == set()
