"""Generate the reference pages of the docs site from the code, never by hand:

- ``reference/rules/index.md``: the catalogue, one row per rule (``stalldoc rules``);
- ``reference/rules/sdNNN.md``: one page per rule, from its docstring (What it does / Why is this
  bad? / Evidence / Fix / References), the test cases that hold it (every test function that
  names its code), and, for the log rules, the real log lines of its fixture with their sources;
- ``reference/cli.md``: every command of ``stalldoc`` with its options, from the click commands.

Run ``python docs/generate.py`` before ``mkdocs build`` (``docs/build.sh`` does both); the
output directory is not kept in git. ``tests/test_docs.py`` builds the site with warnings as
errors and checks every rule and command against its page.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stalldoc.cli import main as cli_main  # noqa: E402
from stalldoc.rules import RULES  # noqa: E402
from stalldoc.rules.base import DOC_SECTIONS, Rule, doc_section  # noqa: E402
from stalldoc.rules.listing import WHEN, summary_of  # noqa: E402

OUT = ROOT / "docs" / "reference"
TESTS = ROOT / "tests"
LOG_FIXTURES = TESTS / "rules" / "fixtures" / "log"
SECTIONS = (*DOC_SECTIONS, "References")
_CODE = re.compile(r"``(.+?)``", re.S)
_RULE_CODE = re.compile(r"^SD\d{3}$")


def markdown(text: str) -> str:
    """A docstring section as markdown: ``code`` quoted as `code`."""
    return _CODE.sub(r"`\1`", text)


def page_name(code: str) -> str:
    return f"{code.lower()}.md"


def test_cases(tests: Path = TESTS) -> dict[str, list[tuple[str, str, str]]]:
    """Rule code -> (test file, test function, what it shows) for every test function whose body
    names the code (``codes("SD201", ...)``, ``by_code("SD201")``, an expected finding)."""
    cases: dict[str, list[tuple[str, str, str]]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            named = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
                     and isinstance(n.value, str) and _RULE_CODE.match(n.value)}
            for code in named:
                cases.setdefault(code, []).append(
                    (str(path.relative_to(ROOT)), node.name, _what(node, source)))
    return cases


def _what(node: ast.FunctionDef, source: str) -> str:
    """A test's own words: its docstring's first line, else its first comment, else its name."""
    doc = ast.get_docstring(node)
    if doc:
        return " ".join(doc.split("\n\n")[0].split())
    body = ast.get_source_segment(source, node) or ""
    comment = re.search(r"^\s*# (.+)$", body, re.M)
    if comment:
        return comment.group(1).strip()
    return node.name.removeprefix("test_").replace("_", " ")


def log_sources(code: str) -> tuple[int, list[str]]:
    """The number of real log lines in the rule's fixture, and the threads they were quoted from."""
    path = LOG_FIXTURES / f"{code}.txt"
    if not path.exists():
        return 0, []
    lines = path.read_text().splitlines()
    sources = [m.group(1) for m in (re.match(r"# source: (\S+)", line) for line in lines) if m]
    count = sum(1 for line in lines if line.strip() and not line.startswith("#"))
    return count, list(dict.fromkeys(sources))


def rule_page(rule: type[Rule], cases: list[tuple[str, str, str]]) -> str:
    doc = rule.doc()
    when = WHEN.get(rule.trigger, (rule.trigger, rule.trigger))
    out = [f"# {rule.code} {rule.name}", "",
           f"**Severity** {rule.severity.value} · **Runs** {when[0]}: {when[1]}", "",
           markdown(summary_of(rule)), ""]
    for heading in SECTIONS:
        body = doc_section(doc, heading)
        if body:
            out += [f"## {heading}", "", markdown(body), ""]
    count, sources = log_sources(rule.code)
    if count:
        out += ["## Seen in real logs", "",
                f"{count} lines quoted from public reports are in its fixture "
                f"(`tests/rules/fixtures/log/{rule.code}.txt`), from:", ""]
        out += [f"- <{url}>" for url in sources] + [""]
    if cases:
        out += ["## Cases the tests hold it to", ""]
        out += [f"- {what} (`{path}::{name}`)" for path, name, what in cases] + [""]
    return "\n".join(out)


def rules_index(rules: tuple[type[Rule], ...]) -> str:
    out = ["# The rule catalogue", "",
           "Every rule has a stable code. `stalldoc rules` lists them, `stalldoc explain CODE` "
           "prints one in full; these pages are generated from the same docstrings.", "",
           "| code | name | severity | runs | what |", "|---|---|---|---|---|"]
    for r in rules:
        out.append(f"| [{r.code}]({page_name(r.code)}) | {r.name} | {r.severity.value} | "
                   f"{WHEN.get(r.trigger, (r.trigger,))[0]} | "
                   f"{markdown(summary_of(r)).replace('|', '&#124;')} |")
    out += ["", "Runs: " + "; ".join(f"**{word}** {meaning}" for word, meaning in WHEN.values()),
            ""]
    return "\n".join(out)


def cli_page(group: click.Group) -> str:
    """Every command: its help as ``stalldoc CMD --help`` prints it, in a code block."""
    out = ["# Command line", "", "Generated from the click commands of `stalldoc`.", ""]
    with click.Context(group, info_name="stalldoc", **group.context_settings) as ctx:
        out += ["```text", group.get_help(ctx), "```", ""]
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            with click.Context(command, info_name=name, parent=ctx,
                               **command.context_settings) as sub:
                out += [f"## stalldoc {name}", "", "```text", command.get_help(sub), "```", ""]
    return "\n".join(out)


def generate(out: Path = OUT) -> list[Path]:
    (out / "rules").mkdir(parents=True, exist_ok=True)
    cases = test_cases()
    written = {out / "rules" / "index.md": rules_index(RULES), out / "cli.md": cli_page(cli_main)}
    for rule in RULES:
        written[out / "rules" / page_name(rule.code)] = rule_page(rule, cases.get(rule.code, []))
    for path, text in written.items():
        path.write_text(text)
    return sorted(written)


if __name__ == "__main__":
    print(f"{len(generate())} pages written to {OUT.relative_to(ROOT)}")
