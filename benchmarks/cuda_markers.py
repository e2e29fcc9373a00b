"""Agent overhead of CUDA sync markers per phase: ``stalldoc.phase`` enter+exit with the agent's
CUDA markers on (an event recorded on the current stream) against the same phase with markers off,
measured in one agent-injected process on a GPU. Without CUDA it measures the inert path (markers
never attach) against a phase without the agent, and says so.

    python benchmarks/cuda_markers.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from stalldoc.run.inject import agent_environment  # noqa: E402

JOB = textwrap.dedent("""
    import time, torch, stalldoc
    from stalldoc.agent import runtime
    agent = runtime.current()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.zeros(1, device="cuda")          # the job initialises CUDA ...
        deadline = time.time() + 5
        while agent.cuda is None and time.time() < deadline:
            time.sleep(0.05)                     # ... and the agent thread attaches
    def phases(n=20000):
        best = 1e9
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(n):
                with stalldoc.phase("step"):
                    pass
            best = min(best, (time.perf_counter() - t0) / n)
        return best
    with_markers = phases()
    markers, agent.cuda = agent.cuda, None      # markers off, the rest of the agent on
    without = phases()
    print(int(cuda), int(markers is not None), with_markers, without)
""")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = agent_environment(Path(tmp), dict(os.environ), os.getpid())
        out = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True,
                             text=True, check=True)
    cuda, attached, on, off = out.stdout.split()
    on_us, off_us = float(on) * 1e6, float(off) * 1e6
    if cuda == "1" and attached == "1":
        print(f"phase enter+exit: {on_us:.2f} us with CUDA markers, {off_us:.2f} us without; "
              f"markers cost {on_us - off_us:.2f} us per phase (ratio {on_us / off_us:.2f})")
    else:
        print(f"no CUDA here: markers stay off (inert path). phase enter+exit {on_us:.2f} us "
              f"vs {off_us:.2f} us, ratio {on_us / off_us:.3f}")


if __name__ == "__main__":
    main()
