"""``stalldoc demo``: watch the demo job and show the diagnosis.

Rank 1's read blocks for twice the stall timeout and 4 s more, long enough for the stall to be
declared and diagnosed, then returns: the job runs to its end, untouched, as every watched job
is under the default ``--on-stall observe``. (Under ``--on-stall kill`` the launcher answers
stalldoc's signal in its own words: torchrun prints a traceback of its ``SignalException``.)"""
from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

from stalldoc.errors import StalldocError
from stalldoc.report.build import build_report
from stalldoc.run.options import WatchOptions
from stalldoc.relay.relay import Relay

JOB = Path(__file__).resolve().parent / "hang_job.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def demo_command(ranks: int) -> tuple[str, ...]:
    return (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(JOB))


def run_demo(ranks: int, stall_timeout: float, run_dir: Path | None) -> int:
    """0 when the stall was found and blamed on the hanging rank, and the job then ran to its
    end, else 1."""
    if importlib.util.find_spec("torch") is None:
        raise StalldocError("the demo needs torch: pip install -c constraints.txt 'stalldoc[demo]'")
    os.environ["DEMO_HANG_SECONDS"] = str(2 * stall_timeout + 4)
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # torchrun's own default, said, not printed
    watcher = Relay(WatchOptions(demo_command(ranks), run_dir, stall_timeout, 0.5, "observe"))
    code = watcher.run()
    doc = build_report(watcher.run_dir)
    blamed = [f for f in doc["findings"] if f["code"] == "SD101" and 1 in f["ranks"]]
    if code == 0 and blamed:
        print(f"demo: the culprit: {blamed[0]['summary']}\n"
              "demo: its read then returned and the job ran to its end, untouched (exit 0);\n"
              "      with --on-stall kill, stalldoc ends a hung job once its diagnosis is stored\n"
              f"demo: next: stalldoc report {watcher.run_dir}   (the post-mortem)\n"
              "            stalldoc explain SD101   (the rule in full)")
        return 0
    print(f"demo: the stall was not diagnosed as expected (watch exited {code})")
    return 1
