"""``stalldoc report --format html`` opened in a real headless Chromium, offline: the real demo
run's page shows its culprit first and Plotly draws its charts; the job's strings stay text; a
GRPO-like run shows GPU curves, kills, launch checks and the plan; two nodes merge.

The screenshot is checked without an image library: its PNG chunks are read, the pixel rows
inflated (zlib), and the rows counted that differ from each other (a blank page has ~1)."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

import support

from support import synthetic_tick
from stalldoc.findings.ledger import Ledger
from stalldoc.model.findings import Finding, Severity
from stalldoc.model.ranks import RankExit, RankProcess
from stalldoc.model.stacks import Frame, RankStacks, ThreadStack
from stalldoc.model.work import StallEpisode
from stalldoc.report.read import read_report
from stalldoc.store.db import RunStore

CHROMIUM = shutil.which("chromium")
REQUIRED = os.environ.get("STALLDOC_REQUIRE_CHROMIUM") == "1"
pytestmark = pytest.mark.skipif(CHROMIUM is None and not REQUIRED,
                                reason="needs Debian's chromium package (set "
                                       "STALLDOC_REQUIRE_CHROMIUM=1 to fail instead of skipping)")
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
           "--proxy-bypass-list=<-loopback>")
CULPRIT = "rank 1 not in all_reduce"
SHOT_COPY = Path("/tmp/b15/html-screenshot.png")
T0 = 1_700_000_000.0


def chromium(tmp: Path, page: Path, *args: str) -> str:
    """Run headless Chromium on ``page`` with no network; its stdout (``--dump-dom``: the DOM
    after the page's scripts ran)."""
    out = subprocess.run([CHROMIUM or "chromium", "--headless", "--disable-gpu", "--no-sandbox",
                          f"--user-data-dir={tmp / 'chromium-profile'}", "--hide-scrollbars",
                          "--virtual-time-budget=10000", *OFFLINE, *args, page.as_uri()],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def render(out: Path, *run_dirs: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "stalldoc", "report", *map(str, run_dirs),
                           "--format", "html", "-o", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def demo_run() -> Path:
    """The session's one real `stalldoc demo` run (rank 1 hangs in its data loader)."""
    return support.demo_run()


@pytest.fixture(scope="module")
def demo_page(demo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    page = tmp_path_factory.mktemp("page") / "report.html"
    return page, render(page, demo_run)


def test_the_demo_page_puts_the_culprit_first_and_draws_its_charts(demo_page, tmp_path):
    page, _ = demo_page
    dom = chromium(tmp_path, page, "--dump-dom")
    # THEN the culprit sentence is there, before the timeline
    assert CULPRIT in dom
    assert dom.index(CULPRIT) < dom.index('id="timeline"') < dom.index('id="findings"')
    # AND plotly.js ran with the network off: it drew the timeline and the memory curves
    assert dom.count('class="main-svg"') >= 3 * 2      # each chart has two main-svg layers
    assert "seconds since start" in dom and "rank 1" in dom
    # AND the waiting ranks' stacks are there too, grouped, the culprit's first
    assert "waiting: collective" in dom and "ranks 0, 2" in dom
    stacks = dom[dom.index('id="stacks"'):]     # the culprit's group before the waiting one
    assert stacks.index(">culprit<") < stacks.index("waiting: collective")
    assert "load_shard" in dom and "all_reduce" in dom


def test_the_demo_page_screenshot_is_not_blank(demo_page, tmp_path):
    page, _ = demo_page
    shot = tmp_path / "report.png"
    chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1400,2400")
    width, height, rows = png_rows(shot.read_bytes())
    assert (width, height) == (1400, 2400)
    assert len(set(rows)) > 200, "the screenshot is (nearly) blank"
    if SHOT_COPY.parent.is_dir():
        shutil.copyfile(shot, SHOT_COPY)


def png_rows(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the (filtered) pixel rows of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)
    stride = 1 + width * (3 if colour == 2 else 4)
    raw = zlib.decompress(idat)
    assert len(raw) == stride * height
    return width, height, [raw[i:i + stride] for i in range(0, len(raw), stride)]


class Links(HTMLParser):
    """The src / href of every element that can load something."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data") and value:
                self.found.append((tag, name, value))


def test_the_page_is_self_contained_with_plotly_inlined_once(demo_page):
    from plotly.offline import get_plotlyjs
    _, html = demo_page
    links = Links()
    links.feed(html)
    remote = [x for x in links.found if x[2].lower().startswith(("http:", "https:", "//"))]
    assert remote == []
    assert not any(tag in ("script", "link", "img", "iframe") for tag, _, _ in links.found)
    assert html.count(get_plotlyjs()[:400]) == 1
    assert len(html) < len(get_plotlyjs()) + 500_000


def _store(run_dir: Path, command: list[str], summary: str, node: str = "node",
           ledger: Ledger | None = None) -> RunStore:
    """A run written through the real store: 2 ranks on 2 GPUs in a rollout, a stall at
    T0 + 5 declared at T0 + 20, an SD101 finding with ``summary``, the stacks."""
    run_dir.mkdir()
    store = RunStore(run_dir)
    store.start_run(run_dir.name, command, node, T0, 15, True)
    for rank in (0, 1):
        store.add_rank(RankProcess(rank, 1000 + rank, rank, ("python", "train.py")), T0)
    for i in range(30):
        store.add_tick(synthetic_tick(T0 + i, 2, 2, "rollout" if i < 12 else "generate"))
    store.save_stall(StallEpisode(1, T0 + 5, T0 + 20, 15, (0, 1), None,
                                  {0: "generate", 1: "generate"}))
    store.add_stacks(1, [RankStacks(r, 1000 + r, T0 + 20, "py-spy", (ThreadStack(
        1000 + r, "MainThread", True, False, (Frame("wait", "dist.py", 3),
                                              Frame("main", "train.py", 9 + r))),))
                         for r in (0, 1)])
    store.put_findings((ledger or Ledger()).stall(T0 + 20, 1, [Finding("SD101", "rank-outside-collective", Severity.ERROR,
                                            (1,), summary, {"frames": ["main (train.py:10)"],
                                                            "seq": 7}, "look at rank 1")]).entries)
    store.commit()
    return store


def test_the_jobs_strings_are_text_not_markup(tmp_path):
    evil = "<script>document.title='pwned'</script>"
    run_dir = tmp_path / "run"
    store = _store(run_dir, ["python", "train.py", f"--name={evil}"],
                   f"rank 1 is in {evil}</script><img src=x onerror=\"document.title='pwned'\">")
    store.end_run(T0 + 30, 1)
    store.close()
    page = tmp_path / "evil.html"
    html = render(page, run_dir)
    assert evil not in html and "<img src=x" not in html
    dom = chromium(tmp_path, page, "--dump-dom")
    assert "pwned</title>" not in dom and "&lt;script&gt;document.title='pwned'" in dom
    assert dom.count('class="main-svg"') >= 2      # the charts still drew


def test_a_grpo_run_shows_gpus_kills_launch_checks_and_the_plan(tmp_path):
    run_dir = tmp_path / "run"
    ledger = Ledger()    # the run's one ledger numbers its findings (the store rows' ids)
    store = _store(run_dir, ["swift", "rlhf", "--rlhf_type", "grpo"], "rank 1 not in broadcast #7",
                   ledger=ledger)
    check = subprocess.run([sys.executable, "-m", "stalldoc", "check", "--gpus", "8",
                            "--dataset-size", "8000", "--format", "json", "--", "swift", "rlhf",
                            "--rlhf_type", "grpo", "--num_generations", "8",
                            "--per_device_train_batch_size", "4"],
                           capture_output=True, text=True, timeout=60)
    checked = json.loads(check.stdout)
    store.set_meta("launch_plan", json.dumps(checked["plan"]))
    store.put_findings(ledger.launch(T0, [Finding(f["code"], f["name"], Severity(f["severity"]),
                                          tuple(f["ranks"]), f["summary"], f["evidence"], f["fix"])
                                  for f in checked["findings"]]).entries)
    for rank in (0, 1):
        store.rank_exit(RankExit(rank, 1000 + rank, T0 + 29, 143, 15, "proc"))
    store.set_meta("ended_by", "stalldoc")
    store.end_run(T0 + 30, 143)
    store.close()
    page = tmp_path / "grpo.html"
    render(page, run_dir)
    dom = chromium(tmp_path, page, "--dump-dom")
    assert "rank 1 not in broadcast #7" in dom
    for title in ("GPU memory used", "PCIe throughput per GPU", "Node memory available"):
        assert f"<h3>{title}</h3>" in dom
    assert "killed by stalldoc" in dom and "exit 143 (SIGTERM)" in dom
    launch = dom[dom.index('id="launch"'):dom.index('id="details"')]
    assert "SD406" in launch and "generation_batch_size" in launch
    assert "max_steps" in launch and str(checked["plan"]["max_steps"]) in launch
    assert "rollouts per epoch R" in launch
    assert dom.count('class="main-svg"') >= 2 * 5


def test_two_nodes_merge_into_one_page(demo_run, tmp_path):
    nodes = [tmp_path / "a", tmp_path / "b"]
    for node in nodes:
        shutil.copytree(demo_run, node, ignore=shutil.ignore_patterns("*.state", "flight"))
    page = tmp_path / "merged.html"
    render(page, *nodes)
    dom = chromium(tmp_path, page, "--dump-dom")
    host = read_report([demo_run]).runs[0].info.node     # the labels: host:directory
    for node in ("a", "b"):
        for rank in (0, 1, 2):
            assert f"rank {rank} ({host}:{node})" in dom   # timeline rows, drawn by Plotly
    assert dom.count(CULPRIT) >= 2
