"""``--log FILE``: its tail at attach, then what is appended, across truncation and rotation."""
from __future__ import annotations

import time
from pathlib import Path

from stalldoc.attach import log_tail
from stalldoc.attach.log_tail import LogTail
from stalldoc.model.samples import LogLine


def test_the_tail_leaves_out_a_cut_first_line_and_keeps_an_unended_last(tmp_path: Path,
                                                                        monkeypatch) -> None:
    monkeypatch.setattr(log_tail, "TAIL_BYTES", 20)
    path = tmp_path / "job.log"
    path.write_bytes(b"first line, long enough to be cut\nsecond\nthird")
    tail = LogTail(path)
    try:
        assert [line.text for line in tail.tail()] == ["second", "third"]
        assert {line.stream for line in tail.tail()} == {"log"}
    finally:
        tail.close()


def test_follow_reads_appended_lines_after_truncation_and_rotation(tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(log_tail, "POLL_SECONDS", 0.05)
    path = tmp_path / "job.log"
    path.write_text("old\n")
    tail = LogTail(path)
    got: list[LogLine] = []
    try:
        assert [line.text for line in tail.tail()] == ["old"]
        tail.follow(got.append)
        with open(path, "a") as fh:
            fh.write("step 1\nstep")
        wait_for(got, ["step 1"])
        with open(path, "a") as fh:
            fh.write(" 2\n")
        wait_for(got, ["step 1", "step 2"])
        path.write_text("")                       # truncated, then written again
        with open(path, "a") as fh:
            fh.write("after truncation\n")
        wait_for(got, ["step 1", "step 2", "after truncation"])
        path.rename(tmp_path / "job.log.1")       # rotated: a new file takes the name
        path.write_text("NCCL error: unhandled system error\n")
        wait_for(got, ["step 1", "step 2", "after truncation",
                       "NCCL error: unhandled system error"])
    finally:
        tail.close()


def wait_for(got: list[LogLine], texts: list[str]) -> None:
    deadline = time.time() + 10
    while [line.text for line in got] != texts and time.time() < deadline:
        time.sleep(0.02)
    assert [line.text for line in got] == texts
