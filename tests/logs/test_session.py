"""``stalldoc logs FILE...`` as a user runs it: saved logs in, the findings out in every report
format, what was read said, bad input refused with one line and its exit code."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

# a torchrun job's merged output: lines quoted from hpcaitech/ColossalAI#3514 (a rank SIGKILLed,
# the launcher's SIGTERM to the others), pytorch's NCCL watchdog from deepseek-ai/DeepSeek-MoE#47
# and the CUDA OOM of antgroup/echomimic_v2#115, behind the ranks' own prefixes
MERGED = """\
[rank0]:[2024-11-26 02:04:20,001] step 10 loss 1.93
[rank1]:[2024-11-26 02:04:20,002] step 10 loss 1.95
[rank1]:[E410 01:50:33.889423318 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) \
Rank 1] Process group watchdog thread terminated with exception: CUDA error: unspecified launch \
failure
[rank0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.22 GiB. GPU 0 has a \
total capacity of 15.69 GiB of which 3.43 GiB is free.
WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 812916 closing signal \
SIGTERM
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: \
812917) of binary: /data/chenhao/anaconda3/envs/ColossalAI-Chat/bin/python
"""


def logs(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stalldoc", "logs", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def merged(tmp_path: Path) -> Path:
    path = tmp_path / "train.log"
    path.write_text(MERGED)
    return path


def test_a_merged_log_gives_one_finding_per_failure_with_its_parts(merged):
    out = logs(merged, "--format", "json")
    assert out.returncode == 0, out.stderr
    findings = {f["code"]: f for f in json.loads(out.stdout)["findings"]}
    assert sorted(findings) == ["SD506", "SD540", "SD543"], findings
    assert findings["SD540"]["ranks"] == [1]
    assert findings["SD540"]["evidence"]["error"] == "unspecified launch failure"
    assert findings["SD506"]["ranks"] == [0]
    died = findings["SD543"]["evidence"]
    assert (died["pid"], died["local_rank"], died["signal"]) == (812917, 3, "SIGKILL")
    assert "OOM killer" in findings["SD543"]["fix"]
    # what was read: the file, its lines, the ranks its prefixes name
    assert f"read {merged}: 6 lines, ranks 0,1 (their [rankN]: prefixes)" in out.stderr


def test_the_text_report_says_what_was_read_as_the_command_did(merged):
    out = logs(merged)
    assert out.returncode == 0, out.stderr
    said = f"{merged}: 6 lines, ranks 0,1 (their [rankN]: prefixes)"
    assert f"stalldoc: read {said}" in out.stderr
    assert f"  read    : {said}" in out.stdout


@pytest.mark.parametrize("fmt,mark", [("text", "[SD543 error]"), ("markdown", "SD543"),
                                      ("html", "SD543"), ("perfetto", "SD543")])
def test_every_report_format_shows_the_findings(merged, fmt, mark):
    out = logs(merged, "--format", fmt)
    assert out.returncode == 0, out.stderr
    assert mark in out.stdout


def test_one_file_per_rank_gzip_or_not_is_lined_up_by_time(tmp_path):
    (tmp_path / "rank0.log").write_text(
        "[2024-05-01 12:00:00,100] step 1\n[2024-05-01 12:00:09,000] step 2\n")
    with gzip.open(tmp_path / "rank1.log.gz", "wt") as fh:
        fh.write("[2024-05-01 12:00:03,000] step 1\n"
                 "RuntimeError: DataLoader worker (pid 25902) is killed by signal: "
                 "Segmentation fault\n")
    out = logs(tmp_path / "rank0.log", tmp_path / "rank1.log.gz", "--format", "json")
    assert out.returncode == 0, out.stderr
    [died] = json.loads(out.stdout)["findings"]
    assert (died["code"], died["ranks"], died["evidence"]["signal"]) == ("SD543", [1], "SIGSEGV")
    assert "rank1.log.gz: 2 lines, rank 1 (its name), 2024-05-01 12:00:03" in out.stderr
    run = json.loads(out.stdout)["run"]
    assert [r["lines"] for r in run["logs_read"]] == [2, 2]


def test_a_kept_run_is_read_by_report_and_the_output_file_holds_the_report(merged, tmp_path):
    out = logs(merged, "--run-dir", tmp_path / "run", "-o", tmp_path / "report.md",
               "--format", "markdown")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert "SD540" in (tmp_path / "report.md").read_text()
    report = subprocess.run([sys.executable, "-m", "stalldoc", "report", str(tmp_path / "run"),
                             "--format", "json"], capture_output=True, text=True, check=True)
    assert {f["code"] for f in json.loads(report.stdout)["findings"]} == {"SD506", "SD540",
                                                                         "SD543"}


def test_healthy_logs_give_no_finding(tmp_path):
    quiet = tmp_path / "quiet.log"
    quiet.write_text(Path(__file__).parent.parent.joinpath("rules", "fixtures",
                                                           "context.txt").read_text())
    out = logs(quiet, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["findings"] == []


@pytest.mark.parametrize("make,said", [
    (lambda p: p.write_bytes(b"\x00\x01\x02"), "a binary file"),
    (lambda p: p.write_bytes(b""), "empty, nothing to read"),
    (lambda p: p.write_bytes("d\u00e9j\u00e0\n".encode("cp1252")), "not UTF-8 text"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: None, "No such file or directory"),
], ids=["binary", "empty", "cp1252", "directory", "missing"])
def test_bad_input_is_one_line_and_exit_1(tmp_path, make, said):
    path = tmp_path / "job.log"
    make(path)
    out = logs(path)
    assert out.returncode == 1, out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("stalldoc: ") and said in out.stderr


def test_no_file_is_a_usage_error():
    out = logs()
    assert out.returncode == 2 and "Missing argument" in out.stderr


def test_what_is_read_is_redacted_and_loses_its_colours_as_watch_reads_it(tmp_path):
    log = tmp_path / "job.log"
    token = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF"
    log.write_text(f"export HF_TOKEN={token}\n"
                   "\x1b[36m(TaskRunner pid=2112)\x1b[0m Killed\n"
                   "OSError: [Errno 28] No space left on device\n")
    out = logs(log, "--run-dir", tmp_path / "run", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert token not in out.stdout
    assert token not in (tmp_path / "run" / "run.db").read_bytes().decode("utf-8", "replace")
    codes = {f["code"] for f in json.loads(out.stdout)["findings"]}
    assert codes == {"SD543", "SD544"}, codes
