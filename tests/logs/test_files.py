"""A saved log read line by line: its encoding, its rank, its times, and what is no log."""
from __future__ import annotations

import gzip
import os
from datetime import datetime
from pathlib import Path

import pytest

from stalldoc.logs.files import KEEP, MAX_LINE, LogFile, LogInputError, rank_of_name
from stalldoc.logs.times import stamp

# lines as real jobs print them (tests/rules/fixtures: their threads)
DEEPSPEED = ("[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] ['/usr/bin/"
             "python3', '-u', 'main.py'] exits with return code = -9")
GLOG = ("[rank1]:[E410 01:50:33.889423318 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID "
        "0(default_pg) Rank 1] Process group watchdog thread terminated with exception: CUDA "
        "error: unspecified launch failure")
VLLM = "INFO 05-14 10:37:05 [core.py:58] Initializing a V1 LLM engine (v0.9.0) with config:"
ISO_ZONE = "2024-04-29T14:55:41,679700+02:00 Out of memory: Killed process 1440763 (perl)"
HOROVOD = "Fri Sep 28 11:14:00 2018[1,5]<stderr>:INFO:tensorflow:Running local_init_op."


def local(*args: int) -> float:
    return datetime(*args).timestamp()


@pytest.mark.parametrize("line,when", [
    (DEEPSPEED, local(2023, 4, 14, 13, 11, 27, 885000)),
    (GLOG, local(2025, 4, 10, 1, 50, 33, 889423)),
    (VLLM, local(2025, 5, 14, 10, 37, 5)),
    (ISO_ZONE, datetime.fromisoformat("2024-04-29T14:55:41.679700+02:00").timestamp()),
    (HOROVOD, local(2018, 9, 28, 11, 14, 0)),
    ("  0%|          | 0/100 [00:00<?, ?it/s]", None),
    ("epoch 39/150", None),
], ids=["deepspeed", "glog", "vllm", "iso-zone", "ctime", "progress-bar", "no-stamp"])
def test_a_lines_stamp_is_read_where_its_logger_puts_it(line, when):
    assert stamp(line, 2025) == when


def test_lines_without_a_stamp_take_the_one_before_and_the_first_take_the_first(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("Traceback (most recent call last):\n" + DEEPSPEED + "\n  File \"x.py\"\n")
    read = list(LogFile(log).lines())
    assert [line.t for line in read] == [local(2023, 4, 14, 13, 11, 27, 885000)] * 3
    assert [line.text for line in read][1] == DEEPSPEED


def test_a_file_without_stamps_keeps_its_order_at_its_last_change(tmp_path):
    log = tmp_path / "out.txt"
    log.write_text("epoch 1\nKilled\n")
    os.utime(log, (1_700_000_000, 1_700_000_000))
    handle = LogFile(log)
    assert [(line.t, line.text) for line in handle.lines()] == [(1_700_000_000, "epoch 1"),
                                                                (1_700_000_000, "Killed")]
    assert (handle.read.lines, handle.read.stamped) == (2, 0)


@pytest.mark.parametrize("name,rank,local_rank", [
    ("rank3.log", 3, None), ("train_rank_12.out", 12, None), ("worker-rank-0.txt", 0, None),
    ("attempt_0/5/stderr.log", None, 5), ("train.log", None, None), ("frank1.log", None, None),
    ("r0.log.gz", None, None)])
def test_a_files_rank_is_what_its_name_says(name, rank, local_rank):
    assert rank_of_name(Path("/logs/run") / name) == (rank, local_rank)


def test_a_rank_files_lines_carry_its_rank_and_a_merged_log_counts_its_prefixes(tmp_path):
    (tmp_path / "rank2.log").write_text("step 1\n")
    [line] = LogFile(tmp_path / "rank2.log").lines()
    assert line.rank == 2
    merged = tmp_path / "merged.log"
    merged.write_text(f"{GLOG}\n[rank0]:step 1\n[default3]:step 1\n")
    handle = LogFile(merged)
    assert [line.rank for line in handle.lines()] == [None, None, None]
    assert (handle.read.ranks, handle.read.local_ranks) == ((0, 1), (3,))


def test_gzip_and_utf16_are_read_as_text(tmp_path):
    with gzip.open(tmp_path / "rank0.log.gz", "wt") as fh:
        fh.write(f"{VLLM}\n已杀死\n")
    assert [x.text for x in LogFile(tmp_path / "rank0.log.gz").lines()] == [VLLM, "已杀死"]
    (tmp_path / "win.log").write_text(f"{DEEPSPEED}\r\n", encoding="utf-16")
    assert [x.text for x in LogFile(tmp_path / "win.log").lines()] == [DEEPSPEED]


def test_a_long_line_is_cut_for_the_rules(tmp_path):
    (tmp_path / "a.log").write_text("x" * (KEEP + 10) + "\nKilled\n")
    assert [len(x.text) for x in LogFile(tmp_path / "a.log").lines()] == [KEEP, 6]


@pytest.mark.parametrize("content,said", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "a binary file"),
    ("caf\u00e9 latin-1\n".encode("latin-1"), "not UTF-8 text"),
    (b"x" * (MAX_LINE + 5) + b"\n", "over 1 MiB"),
    (gzip.compress(b"step 1\n" * 1000)[:20], "cannot be read"),
], ids=["binary", "latin-1", "huge-line", "cut-gzip"])
def test_what_is_no_log_is_one_line_of_error(tmp_path, content, said):
    log = tmp_path / "bad.log"
    log.write_bytes(content)
    with pytest.raises(LogInputError) as caught:
        list(LogFile(log).lines())
    assert said in caught.value.message and "\n" not in caught.value.message
    assert caught.value.exit_code == 1
