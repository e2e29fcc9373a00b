"""What counting each kind of phase's time costs (``agent/runtime.py``'s ``_count_kind``, the
data of SD207 / SD208, the step-share metrics and the report's ``step_shares``): a weight_sync
phase's enter + exit inside a step, as a real job nests it, with the counting and with it
switched off, in one agent-injected process; and the watcher's side per tick: the shares of one
rank from its kept reads, the GPU samples of its ticks generating kept from a tick, SD208's check
of one rank.

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
from stalldoc.model.ranks import RankProcess  # noqa: E402
from stalldoc.model.samples import GenerationSample  # noqa: E402
from stalldoc.model.window import Window  # noqa: E402
from stalldoc.rules.sd208_rollout_gpu_idle import RolloutGpusIdle  # noqa: E402
from stalldoc.sidecar.history import Histories  # noqa: E402
from stalldoc.run.inject import agent_environment  # noqa: E402
from support import grpo_kind_reads, synthetic_tick  # noqa: E402

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
    generation_costs(reads)


def generation_costs(reads: list) -> None:
    """SD208's side: a tick of 8 ranks generating on 8 GPUs kept by the history, and the rule's
    check of one rank over 120 kept ticks generating."""
    ticks = [synthetic_tick(100.0 + i, 8, 8, "generate") for i in range(200)]
    history = Histories()
    per_tick = min(timeit.repeat(lambda: [history.add(t) for t in ticks], number=1,
                                 repeat=5)) / len(ticks)
    samples = tuple(GenerationSample(100.0 + i, 1.0, ((0, 12),)) for i in range(120))
    window = Window(1000.0, (RankProcess(0, 1, 0, ("python",)),), kinds={0: tuple(reads)},
                    generation={0: samples})
    rule = RolloutGpusIdle()
    check = min(timeit.repeat(lambda: list(rule.check(window)), number=200, repeat=5)) / 200
    print(f"the history's whole tick of 8 ranks generating on 8 GPUs: {per_tick * 1e6:.0f} us; "
          f"SD208's check of one rank (120 ticks generating kept): {check * 1e6:.0f} us "
          f"(8 ranks {8 * check * 1e3:.2f} ms a tick)")


if __name__ == "__main__":
    main()
