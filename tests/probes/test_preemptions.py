"""The preemption count a process's agent wrote (``preempted-<pid>.txt``)."""
from __future__ import annotations

from stalldoc.probes.preemptions import read_preemptions


def test_the_last_whole_count_is_read(tmp_path):
    # GIVEN the counts an engine core's agent appended, the last one cut by a write
    (tmp_path / "preempted-42.txt").write_text("5\n8\n" + "1" * 30 + "2\n" * 20 + "13")
    # THEN the last whole line is the count (a cut line is not a smaller count)
    assert read_preemptions(str(tmp_path), 42) == 2
    (tmp_path / "preempted-43.txt").write_text("5\n8\n12\n")
    assert read_preemptions(str(tmp_path), 43) == 12


def test_no_file_or_no_count_is_none(tmp_path):
    assert read_preemptions(str(tmp_path), 7) is None
    assert read_preemptions(None, 7) is None
    (tmp_path / "preempted-7.txt").write_text("12")   # not yet a whole line
    assert read_preemptions(str(tmp_path), 7) is None
