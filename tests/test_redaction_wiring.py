"""Each way job-derived text enters stalldoc redacts it: the log feed, the rules' findings, the
sidecar's messages and its uncaught exceptions, internal error logs, the metrics job name."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from stalldoc.errors import log_traceback
from stalldoc.launch.config import parse_command
from stalldoc.sidecar.log_feed import LogFeed
from stalldoc.sidecar.metrics import job_name
from stalldoc.model.samples import LogLine
from stalldoc.model.window import Window
from stalldoc.rules import run_rules
from stalldoc.sidecar.watcher import Watcher

SECRET_LINE = "Exception: Servers not reachable after 240.0s (http://admin:RollPw-31@10.0.0.5:8000)"


def test_the_log_feed_hands_on_redacted_lines_only():
    feed = LogFeed()
    feed.put(LogLine(1.0, "stdout", "step 1 api_key=FeedKey-77 loss 0.5"))
    feed.put(LogLine(2.0, "stderr", "step 2 loss 0.4"))
    drained = feed.drain()
    expected = ["step 1 api_key=*** loss 0.5", "step 2 loss 0.4"]
    assert [line.text for line in drained.lines] == expected        # to the store
    assert list(feed.tail) == expected                                # to the diagnosis
    assert [line.text for line in feed.take_unread()] == expected     # to the tick rules
    assert [(line.t, line.stream) for line in drained.lines] == [(1.0, "stdout"), (2.0, "stderr")]


def test_findings_come_out_of_the_rules_redacted():
    # a line that was not redacted before (the rules redact whatever they quote themselves)
    window = Window(100.0, (), log=(LogLine(99.0, "stdout", SECRET_LINE),))
    findings = [f for f in run_rules(window, "tick") if f.code == "SD507"]
    assert len(findings) == 1
    assert "RollPw-31" not in findings[0].summary
    assert "RollPw-31" not in str(findings[0].evidence)
    assert findings[0].evidence["lines"] == [
        "Exception: Servers not reachable after 240.0s (http://***@10.0.0.5:8000)"]
    assert findings[0].evidence["waited_seconds"] == "240.0"


def test_what_the_sidecar_says_is_redacted():
    sent: list[dict[str, object]] = []
    watcher = SimpleNamespace(link=SimpleNamespace(send=lambda **message: sent.append(message)))
    Watcher.say(watcher, "launch checks: cannot read /cfg/run.yaml: bad line 'hub_token: "
                         "hf_SayToken0123456789abcdef'")
    assert sent == [{"say": "launch checks: cannot read /cfg/run.yaml: bad line 'hub_token: ***'"}]


def test_an_internal_error_is_logged_redacted(tmp_path: Path):
    try:
        raise ValueError("cannot parse 'password=TraceSecret-5' in line 3")
    except ValueError:
        last = log_traceback(tmp_path / "errors.log")
    assert last == "ValueError: cannot parse 'password=***' in line 3"
    logged = (tmp_path / "errors.log").read_text()
    assert "TraceSecret-5" not in logged and "Traceback" in logged


def test_the_metrics_job_name_is_redacted():
    config = parse_command(["swift", "--hub_token=hf_JobName0123456789abcdef", "rlhf"], {})
    assert job_name(config) == "swift --hub_token=***"
    assert job_name(parse_command(["torchrun", "--nproc_per_node", "2", "train.py",
                                   "--hub_token", "hf_JobName0123456789abcdef"], {})) == "train.py"



def test_the_sidecars_uncaught_exceptions_reach_its_log_redacted():
    code = ("import threading; from stalldoc.sidecar.process import redact_uncaught; redact_uncaught(); "
            "t = threading.Thread(target=lambda: {}['token=ThreadSecret-1']); t.start(); t.join(); "
            "raise RuntimeError('bad line: http://u:MainSecret-2@h/x')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "ThreadSecret-1" not in out.stderr and "MainSecret-2" not in out.stderr
    assert "KeyError: 'token=***'" in out.stderr
    assert out.stderr.rstrip().endswith("RuntimeError: bad line: http://***@h/x")
