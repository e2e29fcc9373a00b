"""``stalldoc demo``: watch the demo job with --on-stall kill and show the diagnosis."""
from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

from stalldoc.errors import StalldocError, EXIT_STALL_KILLED
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
    """0 when the stall was found and blamed on the hanging rank, else 1."""
    if importlib.util.find_spec("torch") is None:
        raise StalldocError("the demo needs torch: pip install -c constraints.txt 'stalldoc[demo]'")
    watcher = Relay(WatchOptions(demo_command(ranks), run_dir, stall_timeout, 0.5, "kill"))
    code = watcher.run()
    doc = build_report(watcher.run_dir)
    blamed = [f for f in doc["findings"] if f["code"] == "SD101" and 1 in f["ranks"]]
    if code == EXIT_STALL_KILLED and blamed:
        print(f"demo: rank 1 was named as the culprit: {blamed[0]['summary']}")
        print("demo: a launcher traceback above (torchrun's SignalException) is torchrun "
              "answering stalldoc's SIGTERM, not part of the diagnosis")
        print(f"demo: next: stalldoc report {watcher.run_dir}   (the post-mortem)\n"
              f"            stalldoc explain SD101   (the rule in full)")
        return 0
    print(f"demo: the stall was not diagnosed as expected (watch exited {code})")
    return 1
