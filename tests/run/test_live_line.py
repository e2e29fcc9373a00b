"""The live status line: unit behaviour of the terminal, and a real watch on a pseudo-terminal."""
from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import time

from stalldoc.run import terminal as live
from stalldoc.run.terminal import RankLine, Terminal, format_status


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_is_erased_before_job_output_and_messages():
    err, (out_r, out_w) = Tty(), os.pipe()
    terminal = Terminal(err)
    terminal.status("[stalldoc] status one")
    terminal.job_output(out_w, b"loss 0.5\n")
    terminal.status("[stalldoc] status two")
    terminal.message("STALL #1")
    assert os.read(out_r, 100) == b"loss 0.5\n"
    assert err.getvalue() == ("\r\x1b[K[stalldoc] status one" "\r\x1b[K"
                              "\r\x1b[K[stalldoc] status two" "\r\x1b[K" "[stalldoc] STALL #1\n")


def test_a_progress_bar_keeps_its_line_until_the_job_goes_quiet(monkeypatch):
    err, (_, out_w) = Tty(), os.pipe()
    terminal = Terminal(err)
    terminal.job_output(out_w, b"\rsteps: 40%|####")
    terminal.status("[stalldoc] while the bar moves")
    assert err.getvalue() == ""
    monkeypatch.setattr(live, "QUIET_SECONDS", 0.0)
    terminal.status("[stalldoc] after the bar froze")
    assert err.getvalue() == "\n\r\x1b[K[stalldoc] after the bar froze"


def test_no_terminal_no_status():
    err = io.StringIO()
    terminal = Terminal(err)
    terminal.status("[stalldoc] hidden")
    terminal.message("shown")
    assert err.getvalue() == "[stalldoc] shown\n"


def test_status_names_every_rank_and_the_stall():
    ranks = [RankLine(0, 0.4, "train/step"), RankLine(1, 14.0, "load_shard"),
             RankLine(2, 3.0, "", dead=True)]
    text = format_status(3725.0, ranks, 60.0, stall_id=2)
    assert text.startswith("[stalldoc] 1:02:05 3 ranks STALL #2 (threshold 60s)")
    assert "r0 train/step 0s" in text and "r1 load_shard 14s" in text and "r2 dead" in text
    assert " ok " in format_status(5.0, ranks[:1], 30.0, None)


def test_watch_on_a_terminal_draws_status_and_keeps_job_lines_whole(tmp_path):
    """stalldoc's stderr and the job's output on one real pseudo-terminal."""
    job = "import time\nprint('first line', flush=True)\ntime.sleep(2.5)\nprint('second line')\n"
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalldoc", "watch", "--run-dir", str(tmp_path / "run"),
         "--interval", "0.2", "--", sys.executable, "-c", job],
        stdin=subprocess.DEVNULL, stdout=sub, stderr=sub, env={**os.environ, "COLUMNS": "200"})
    os.close(sub)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(timeout=30) == 0
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert "\r\x1b[K[stalldoc] 0:00:0" in text           # the status line was drawn in place
    assert "r0 " in text and " ok " in text
    # what the terminal shows: each line as left after its last erase-line
    shown = [line.split("\r\x1b[K")[-1] for line in text.split("\n")]
    assert "first line" in shown and "second line" in shown    # whole, not interleaved
    assert shown[-2].startswith("[stalldoc] job exited 0")      # no status left behind
    assert shown[-1] == ""
