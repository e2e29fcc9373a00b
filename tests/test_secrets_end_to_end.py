"""Secrets a job prints or is given never reach the run directory, the report or stalldoc's own
messages; the job's own output passes through untouched."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from support import SCENARIOS, watch

sys.path.insert(0, str(SCENARIOS))
import leaky_job  # noqa: E402
from secret_kinds import KINDS, PEM_BODY  # noqa: E402

HF_TOKEN = "hf_CmdLineToken0123456789abcdefXYZ"
STRIPE_ENV = "sk_live_EnvOnly0123456789abcdefGH"
SLACK_ARG = "https://hooks.slack.com/services/T0ARGV0001/B0ARGV0002/ArgvOnlyWebhookSecret99"
SECRETS = [HF_TOKEN, leaky_job.URL_PASSWORD, leaky_job.API_KEY, leaky_job.JWT,
           leaky_job.ROLLOUT_PASSWORD, STRIPE_ENV, "ArgvOnlyWebhookSecret99",
           *[kind.secret for kind in KINDS], *PEM_BODY]
STALLDOC = [sys.executable, "-m", "stalldoc"]


def _database_text(path: Path) -> str:
    """Every row of every table, as SQL: a value split across pages is whole here."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


def _report(run_dir: Path, *options: str) -> str:
    return subprocess.run([*STALLDOC, "report", str(run_dir), *options], capture_output=True,
                          text=True, check=True).stdout


def test_no_secret_reaches_the_run_directory_the_report_or_stalldocs_messages(tmp_path):
    # GIVEN a job whose command line holds a token and which prints secrets, one of them in a
    # line that opens a finding (SD507)
    run_dir = tmp_path / "run"
    job = (f"python {SCENARIOS / 'leaky_job.py'} {run_dir} --hf_token {HF_TOKEN} "
           f"--notify {SLACK_ARG} --max_new_tokens 512")
    # WHEN stalldoc watches it, with a key in its environment too
    result = watch(tmp_path, ["bash", "-c", job], env={"STRIPE_API_KEY": STRIPE_ENV})
    # THEN the job ran and the finding was made
    assert result.code == 0, result.stderr
    report = result.report()
    sd507 = [f for f in report["findings"] if f["code"] == "SD507"]
    assert sd507 and "http://***@10.0.0.5:8000" in sd507[0]["summary"]
    # AND no secret is in any file of the run directory, the reports or stalldoc's stderr
    files = [p for p in sorted(run_dir.rglob("*")) if p.is_file()]
    assert {"run.db", "sidecar.log"} <= {p.name for p in files}
    places = {str(p.relative_to(run_dir)): p.read_bytes().decode("utf-8", "replace") for p in files}
    places["run.db rows"] = _database_text(run_dir / "run.db")
    places["report json"] = _report(run_dir, "--format", "json")
    places["report text"] = _report(run_dir)
    places["report markdown"] = _report(run_dir, "--format", "markdown")
    for kind, name in (("html", "report.html"), ("perfetto", "trace.json")):
        out = tmp_path / name
        _report(run_dir, "--format", kind, "-o", str(out))
        places[f"report {kind}"] = out.read_text(encoding="utf-8")
    places["stalldoc stderr"] = result.stderr
    leaks = {(place, secret) for place, text in places.items() for secret in SECRETS
             if secret in text}
    assert leaks == set()
    # AND the stored command line keeps its structure and what is not secret
    command = report["run"]["command"]
    assert command[:2] == ["bash", "-c"]
    assert "--hf_token *** --notify https://hooks.slack.com/services/*** --max_new_tokens 512" \
        in command[2]
    assert "rollout server not reachable" in result.stderr   # the live print of the finding
    # AND the job's own output went through untouched, secrets and all
    assert [line for line in leaky_job.LINES if line not in result.stdout] == []
    assert f"hf_token='{HF_TOKEN}'" in result.stdout
    assert all(kind.line in result.stdout for kind in KINDS) and PEM_BODY[0] in result.stdout
    # AND the key block was hidden line by line in the stored log, around its own lines
    logs = [row[0] for row in sqlite3.connect(run_dir / "run.db").execute(
        "SELECT line FROM logs ORDER BY rowid")]
    start = logs.index("deploy key:")
    assert logs[start + 1] == "-----BEGIN RSA PRIVATE KEY-----"
    assert logs[start + 2:start + 2 + len(PEM_BODY)] == ["***"] * len(PEM_BODY)


def test_the_agent_records_an_uncaught_exception_redacted(tmp_path):
    from stalldoc.agent.state_reader import read_state
    from stalldoc.run.inject import agent_environment
    env = agent_environment(tmp_path, dict(os.environ), os.getpid())
    code = ("import os, sys; print(os.getpid(), flush=True); "
            "raise RuntimeError('upload to https://uploader:ExcPw-99x@hub.example.com failed')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "ExcPw-99x" in out.stderr   # the job's own traceback
    state_file = tmp_path / "agents" / f"agent-{out.stdout.split()[0]}.state"
    assert b"ExcPw-99x" not in state_file.read_bytes()
    assert read_state(str(state_file)).error == \
        "RuntimeError: upload to https://***@hub.example.com failed"
