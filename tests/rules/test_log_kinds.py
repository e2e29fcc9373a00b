"""The kinds of failure (SD539-SD545) over every real line of the catalogue.

``fixtures/context.txt`` holds healthy lines printed around failures, quoted verbatim from public
threads (``# source:`` each): no tick rule may find any of them, behind any launcher's prefix.
Every failure line of ``fixtures/log`` makes one finding, not one per rule that knows its words:
a kind leaves a line to the rule that names its wording.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import RULES, run_rules
from stalldoc.rules.line_parts import clean_url, parts
from stalldoc.rules.log_kind import LogKind
from tests.rules.test_log_fixtures import CASES, LAUNCHER_PREFIXES, SOURCE

CONTEXT = Path(__file__).parent / "fixtures" / "context.txt"
KINDS = {rule.code for rule in RULES if issubclass(rule, LogKind)}


def context_lines() -> list[tuple[str, str]]:
    source, lines = "", []
    for raw in CONTEXT.read_text(encoding="utf-8").splitlines():
        if raw.startswith("# source:"):
            source = raw.split(":", 1)[1].strip()
        elif raw.strip() and not raw.startswith("#"):
            lines.append((source, raw))
    return lines


CONTEXT_LINES = context_lines()


def window(*texts: str) -> Window:
    return Window(100.0, (), log=tuple(LogLine(99.0, "stderr", t) for t in texts))


@pytest.mark.parametrize("source,line", CONTEXT_LINES,
                         ids=[f"context-{i}" for i in range(len(CONTEXT_LINES))])
def test_a_healthy_line_printed_around_failures_is_quiet(source, line):
    assert SOURCE.fullmatch(source), source
    for prefix in LAUNCHER_PREFIXES:
        assert run_rules(window(prefix + line), "tick") == [], prefix


@pytest.mark.parametrize("code,line", [(c, line) for c, _, line, _ in CASES],
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_failure_line_makes_one_finding(code, line):
    found = run_rules(window(line), "tick")
    assert [f.code for f in found] == [code]


def test_the_kinds_are_read_from_many_projects():
    """Round three: at least 60 real lines of the kinds, from at least 25 projects, and at least
    20 context lines."""
    lines = [(source, line) for code, source, line, _ in CASES if code in KINDS]
    projects = {SOURCE.fullmatch(source)[1] for source, _ in lines}
    assert len({line for _, line in lines}) >= 60
    assert len(projects) >= 25
    assert len(CONTEXT_LINES) >= 20


def test_a_watchdog_that_ended_on_a_cuda_error_is_the_cuda_error():
    line = ("[rank1]:[E410 01:50:33.889423318 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID "
            "0(default_pg) Rank 1] Process group watchdog thread terminated with exception: CUDA "
            "error: unspecified launch failure")
    [found] = run_rules(window(line), "tick")
    assert (found.code, found.ranks) == ("SD540", (1,))
    assert found.evidence["error"] == "unspecified launch failure"


def test_the_fix_follows_what_the_line_says():
    killed, bus = (run_rules(window(text), "tick")[0] for text in (
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) "
        "local_rank: 1 (pid: 14447) of binary:",
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
        "shared memory (shm)."))
    assert "OOM killer" in killed.fix and "shm" in bus.fix
    assert bus.evidence["signal"] == "SIGBUS"


def test_a_url_loses_its_credentials_query_and_fragment():
    line = ("requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: "
            "https://user:hunter2@hub.example.com:8443/api/models/x?token=abc#frag")
    found = parts(line)
    assert found["url"] == "https://hub.example.com:8443/api/models/x"
    assert (found["host"], found["port"], found["http_status"]) == ("hub.example.com", 8443, 403)
    assert clean_url("s3", "bucket/key?X-Amz-Signature=1") == "s3://bucket/key"
