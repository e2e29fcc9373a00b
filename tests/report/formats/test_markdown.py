"""``stalldoc report --format markdown``: the block pasted into a bug report, from real runs (the
demo, a watched stand-in `swift`) and from a big run written with the real store. Parsed with a
real Markdown parser (markdown-it-py, CommonMark with GFM tables)."""
from __future__ import annotations

import json
import os
import platform
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import support
from markdown_it import MarkdownIt

from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.work import StallEpisode
from stalldoc.report.formats import FORMATS, reporter
from stalldoc.report.formats.markdown import MAX_LINES
from stalldoc.report.read import read_report
from stalldoc.store.db import RunStore
from support import stand_in_swift, watch

SECRETS = ("hf_abcdefghijklmnopqrstuvwx", "wandb-secret-value-123",
           "sk-proj-abcdefghijklmnopqrstuvwx")


def markdown(*run_dirs: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "stalldoc", "report", *map(str, run_dirs),
                          "--format", "markdown"], capture_output=True, text=True, check=True)
    return out.stdout


def parsed(text: str) -> list:
    return MarkdownIt("commonmark").enable("table").parse(text)


def fences(text: str) -> list[tuple[str, str]]:
    """(info, content) of every fenced code block, as the parser saw them."""
    return [(t.info, t.content) for t in parsed(text) if t.type == "fence"]


def table_cells(text: str) -> list[list[str]]:
    """The body rows of the first table, as the parser saw them."""
    tokens = parsed(text)
    rows, row, in_body = [], [], False
    for token in tokens:
        if token.type == "tbody_open":
            in_body = True
        elif token.type == "tr_close" and in_body:
            rows.append(row)
            row = []
        elif token.type == "inline" and in_body:
            row.append(token.content)
        elif token.type == "tbody_close":
            break
    return rows


@pytest.fixture(scope="module")
def demo_run() -> Path:
    """The session's one real `stalldoc demo` run (rank 1 hangs in its data loader)."""
    return support.demo_run()


def test_markdown_is_a_format():
    assert "markdown" in FORMATS and reporter("markdown").suffix == ".md"


def test_the_demo_run_as_a_bug_report(demo_run):
    text = markdown(demo_run)
    assert len(text.splitlines()) <= MAX_LINES
    # the verdict: the culprit sentence first
    first = next(line for line in text.splitlines() if line.startswith("**"))
    assert "rank 1 not in all\\_reduce" in first and "load\\_shard" in first
    # the versions recorded at launch by the lowest rank whose agent published them with torch
    # imported (rank 0 on an idle node; on a loaded one rank 0 may still be importing torch
    # when another rank has published), in a real table
    versions = {row[0]: row[1] for row in table_cells(text)}
    assert versions["torch"].startswith("2.13.0")
    assert versions["Python"] == platform.python_version()
    assert re.search(r"Versions from rank [0-2] at launch", text), text
    # one fenced stack per group: rank 1's load_shard first (the culprit), the waiting ranks too
    blocks = [content for info, content in fences(text) if info == "text"]
    assert blocks[0].splitlines()[0].startswith("load_shard (")
    assert any(block.startswith("all_reduce (") for block in blocks[1:])
    assert "Rank 1 (waiting: sleep) in load\\_shard" in text
    # the command, in a bash block
    [command] = [content for info, content in fences(text) if info == "bash"]
    assert "torch.distributed.run" in command and "hang_job.py" in command
    assert "Made by stalldoc" in text.strip().splitlines()[-1]


def test_a_watched_swift_command_keeps_its_plan_and_loses_its_secrets(tmp_path):
    swift = stand_in_swift(tmp_path)
    result = watch(tmp_path, [str(swift), "rlhf", "--rlhf_type", "grpo", "--num_generations", "2",
                              "--per_device_train_batch_size", "2",
                              "--hub_token", SECRETS[0], f"WANDB_API_KEY={SECRETS[1]}",
                              "--report_to", "wandb"])
    assert result.code == 0, result.stderr
    text = markdown(result.run_dir)
    assert not any(secret in text for secret in SECRETS)
    [command] = [content for info, content in fences(text) if info == "bash"]
    assert "--hub_token ***" in command and "WANDB_API_KEY=***" in command
    # the launch plan the watcher worked out before launch
    plans = [content for info, content in fences(text) if info == "text"]
    assert any("generation batch Gb" in plan for plan in plans)
    stored = read_report([result.run_dir]).runs[0].info
    assert stored.launch is not None and stored.launch["plan"]["num_generations"] == 2
    assert "findings" not in stored.launch
    # nothing published by a rank that never imported torch within 10 s: the watcher's own
    assert stored.versions["source"].startswith("watcher")
    assert stored.versions["python"] == platform.python_version()


def _stack(rank: int, depth: int, variant: int) -> RankStacks:
    frames = tuple(Frame(f"fn_{variant}_{i}", f"/src/pkg/mod_{i}.py", 10 + i) for i in range(depth))
    return RankStacks(rank, 1000 + rank, 50.0, "py-spy", (ThreadStack(1000 + rank, "MainThread",
                                                                      True, True, frames),))


def big_run(run_dir: Path, node: str, ranks: int = 64, findings: int = 40) -> Path:
    """A run of ``ranks`` ranks with ``findings`` findings, every rank in its own frames,
    three stalls, a 400-word command and a long plan, written with the real store."""
    run_dir.mkdir(parents=True)
    store = RunStore(run_dir)
    command = ["swift", "rlhf", "--hub_token", SECRETS[0]] + [
        f"--option_{i}" if i % 2 == 0 else f"value_{i}" for i in range(400)]
    store.start_run(run_dir.name, command, node, 10.0, 60.0, True)
    for rank in range(ranks):
        store.add_rank(RankProcess(rank, 1000 + rank, rank % 8, ("python",)), 10.0)
    for stall in (1, 2, 3):
        store.save_stall(StallEpisode(stall, 20.0 * stall, 20.0 * stall + 5, 5.0,
                                      tuple(range(ranks))))
        store.add_stacks(stall, [_stack(r, 40, r) for r in range(ranks)])
    store.put_findings(Ledger().stall(70.0, 3, [
        Finding(f"SD{100 + i}", f"rule-{i}", Severity.ERROR if i % 3 else Severity.WARNING,
                tuple(range(ranks)), f"finding {i} with <module> and token={SECRETS[2]}",
                {}, f"fix {i}") for i in range(findings)]).entries)
    store.set_meta("versions", json.dumps({"python": "3.11.7", "torch": "2.13.0",
                                           "source": "rank 0"}))
    store.set_meta("launch_plan", json.dumps({"plan": {"arithmetic": [
        f"line {i}" for i in range(30)]}, "resources": {}, "skipped": [f"check {i} (why)"
                                                                      for i in range(10)]}))
    store.end_run(80.0, 124)
    store.close()
    return run_dir


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_big_run_stays_short_enough_to_paste(tmp_path, nodes):
    runs = [big_run(tmp_path / f"node{n}", f"host{n}") for n in range(nodes)]
    text = reporter("markdown").render(read_report(runs))
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, len(lines)
    assert "more finding(s)" in text and "more group(s) of ranks" in text
    assert text.startswith("### What happened") and "**SD101 (error)" in text
    assert "outer frame(s)" in text and "more line(s) of arguments" in text
    assert not any(secret in text for secret in SECRETS)
    # the frames' <module> is text, not an HTML tag: the only HTML is the closing line's
    html = [c.content for t in parsed(text) if t.children for c in t.children
            if c.type == "html_inline"]
    assert html == ["<sub>", "</sub>"]
    assert len(fences(text)) == text.count("\n```bash") + text.count("\n```text")


def test_a_secret_stored_in_clear_by_an_older_stalldoc_is_redacted_again(tmp_path):
    run_dir = big_run(tmp_path / "run", "host", ranks=2, findings=1)
    with sqlite3.connect(run_dir / "run.db") as conn:
        conn.execute("UPDATE run SET command = ?", (json.dumps(
            ["swift", "--hub_token", SECRETS[0], f"WANDB_API_KEY={SECRETS[1]}"]),))
    text = markdown(run_dir)
    assert not any(secret in text for secret in SECRETS)
    assert "--hub_token ***" in text


def test_a_run_recorded_before_versions_were_says_so(tmp_path):
    (tmp_path / "old").mkdir()
    store = RunStore(tmp_path / "old")
    store.start_run("old", ["python", "train.py"], "host", 1.0, 60.0, False)
    store.end_run(2.0, 0)
    store.close()
    text = markdown(tmp_path / "old")
    assert "Not recorded" in text and "No stall was detected" in text
    assert [info for info, _ in fences(text)] == ["bash"]


def test_the_driver_and_gpus_come_from_nvml_in_the_watcher(tmp_path):
    # two scripted GPUs: the pynvml functions replaced in the watcher, nothing above them
    nvml = Path(__file__).resolve().parents[2] / "nvml_sitecustomize"
    result = watch(tmp_path, [sys.executable, "-c", "print('trained')"],
                   env={"PYTHONPATH": os.pathsep.join([str(nvml),
                                                       os.environ.get("PYTHONPATH", "")])})
    assert result.code == 0, result.stderr
    text = markdown(result.run_dir)
    versions = {row[0]: row[1] for row in table_cells(text)}
    assert versions["NVIDIA driver"] == "550.54.15"
    assert "GPUs: 2 x NVIDIA H100 80GB HBM3 (80 GiB)." in text
