"""What counting each kind of phase's time costs (``agent/runtime.py``'s ``_count_kind``, the
data of SD207, the step-share metrics and the report's ``step_shares``): a weight_sync phase's
enter + exit inside a step, as a real job nests it, with the counting and with it switched off,
in one agent-injected process; and the watcher's side, the shares of one rank from its kept
reads, per tick.

    python benchmarks/phase_kinds.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from stalldoc.analysis.phase_shares import step_shares  # noqa: E402
from stalldoc.run.inject import agent_environment  # noqa: E402
from support import grpo_kind_reads  # noqa: E402

MICRO = textwrap.dedent("""
    import time
    from stalldoc.agent import runtime, statefile
    agent = runtime.current()
    assert agent is not None, "agent not running"
    agent.phase_enter("step")
    counting, kind_of = agent._count_kind, statefile.phase_kind

    def block(n=20000):
        t0 = time.perf_counter()
        for _ in range(n):
            agent.phase_enter("weight_sync")
            agent.phase_exit("weight_sync")
        return (time.perf_counter() - t0) / n

    on, off = [], []
    for _ in range(15):          # the two arms in turns: the machine's load falls on both
        agent._count_kind, statefile.phase_kind = counting, kind_of
        on.append(block())
        agent._count_kind, statefile.phase_kind = (lambda now: None), (lambda name: -1)
        off.append(block())
    print(min(on), min(off))
""")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = agent_environment(Path(tmp), {**os.environ}, os.getpid())
        out = subprocess.run([sys.executable, "-c", MICRO], env=env, capture_output=True,
                             text=True, check=True)
    kind, plain = (float(v) for v in out.stdout.split())
    print(f"a weight_sync phase in a step, enter + exit: {kind * 1e6:.2f} us counted, "
          f"{plain * 1e6:.2f} us not; the counting: {(kind - plain) * 1e6:.2f} us a phase")
    print(f"a sync of 10,000 tensors, one call each: {(kind - plain) * 1e4 * 1e3:.1f} ms of "
          "counting a step")
    reads = grpo_kind_reads([{"weight_sync": 6.0, "generate": 2.0, "step": 2.0}] * 63)
    per = min(timeit.repeat(lambda: step_shares(0, reads), number=200, repeat=5)) / 200
    print(f"the watcher's shares of one rank from {len(reads)} kept reads: {per * 1e6:.0f} us "
          f"a tick (x ranks: 8 ranks {8 * per * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
