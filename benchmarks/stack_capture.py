"""Stack capture of N ranks in parallel (target <= 1 s for 8), against one rank captured alone
in the same run.

    python benchmarks/stack_capture.py [N]
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.model.ranks import RankProcess
from stalldoc.probes.pyspy import StackProbe  # noqa: E402

RANK = ("import threading, time\n"
        "for i in range(4):\n"
        "    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "import torch\n"
        "time.sleep(600)\n")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    procs = [subprocess.Popen([sys.executable, "-c", RANK]) for _ in range(count)]
    try:
        time.sleep(8)  # let torch import
        ranks = [RankProcess(i, p.pid, i, ()) for i, p in enumerate(procs)]
        probe = StackProbe(None)
        single = min(_timed(lambda: probe.capture(ranks[0], False)) for _ in range(5))
        many = min(_timed(lambda: probe.capture_all(ranks, set())) for _ in range(5))
        stacks = probe.capture_all(ranks, set())
        assert all(s.method == "py-spy" and s.threads for s in stacks.values())
        print(f"one rank: {single * 1e3:.0f} ms; {count} ranks in parallel: {many * 1e3:.0f} ms "
              f"(ratio {many / single:.2f} x one rank; target <= 1 s for 8)")
    finally:
        for p in procs:
            p.kill()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
