"""The agent's start-up cost per Python process (target <= 5 ms): ``python -c pass`` with the
agent injected against the same without it, interleaved, medians of ``--runs`` each, in the same
run. Short-lived processes matter: a code-execution reward starts one Python per sample.

    python benchmarks/agent_startup.py [--runs 40]

Byte-code caches are allowed for both sides (PYTHONDONTWRITEBYTECODE is dropped and the agent's
modules compiled first), as in an installed stalldoc. The agent's own figure, from its state files
(bootstrap start to agent running), is printed beside the wall-clock difference.
"""
from __future__ import annotations

import argparse
import compileall
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from stalldoc.agent.state_reader import read_state  # noqa: E402
from stalldoc.run.inject import agent_environment  # noqa: E402


def _once(env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    compileall.compile_dir(str(ROOT / "stalldoc"), quiet=1)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        agent = agent_environment(Path(tmp), base, os.getpid())
        plain, injected = [], []
        for _ in range(args.runs):
            plain.append(_once(base))
            injected.append(_once(agent))
        own = sorted(read_state(p).identity.startup_seconds
                     for p in glob.glob(os.path.join(tmp, "agents", "agent-*.state")))
    p, a = statistics.median(plain) * 1e3, statistics.median(injected) * 1e3
    print(f"python -c pass: {p:.1f} ms without the agent, {a:.1f} ms with it "
          f"(+{a - p:.1f} ms, ratio {a / p:.3f}; target +5 ms)")
    if own:
        print(f"agent's own start-up (state files): median {own[len(own) // 2] * 1e3:.2f} ms, "
              f"max {own[-1] * 1e3:.2f} ms over {len(own)} processes")


if __name__ == "__main__":
    main()
